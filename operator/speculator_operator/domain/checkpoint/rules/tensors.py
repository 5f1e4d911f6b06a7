"""Rules on the draft's tensors as the safetensors headers list them: fc, lm_head, embed_tokens, the
vocabulary maps, layer 0's attention and the layer count, each family's layout (docs/reference/speculators.md §2).

Header-only: the data behind them is rules/deep.py's.
"""

from __future__ import annotations

from collections.abc import Iterator

from speculator_operator.domain.algorithms import Algorithm, Family
from speculator_operator.domain.checkpoint.rules.base import AuditContext, Severity, _aux_count, rule


@rule("fc-shape", Severity.ERROR, "fc.weight is [hidden, aux_count x hidden]")
def fc_shape(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    h, a = ck.hidden_size, _aux_count(ck)
    if ck.family not in (Family.EAGLE, Family.DFLASH) or h is None or a is None:
        return
    fc = ck.tensor("fc.weight")
    if fc is None:
        yield "fc.weight is missing"
    elif list(fc.shape) != [h, a * h]:
        ids = ck.config.get(ck.aux_ids_key)
        why = f"{len(ids)} aux ids" if isinstance(ids, list) and ids else "the default 3 aux layers"
        yield f"fc.weight is {list(fc.shape)}, expected [{h}, {a * h}] ({why} x hidden {h})"


@rule("lm-head", Severity.ERROR, "lm_head is [draft_vocab, hidden] where the family saves it")
def lm_head(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    head = ck.tensor("lm_head.weight")
    h, vd, v = ck.hidden_size, ck.draft_vocab_size, ck.verifier_vocab_size
    if ck.family == Family.EAGLE:
        expected = True
    elif ck.family == Family.DFLASH:
        if vd is None or v is None:
            return
        expected = vd != v  # the DFlash family saves lm_head only for a pruned vocabulary
    else:
        return
    if expected and head is None:
        yield f"lm_head.weight is missing (draft_vocab_size {vd}, verifier vocab {v})"
    elif head is not None and h is not None and vd is not None and list(head.shape) != [vd, h]:
        yield f"lm_head.weight is {list(head.shape)}, expected [{vd}, {h}] (draft_vocab_size x hidden)"


@rule("embed-tokens", Severity.ERROR, "embed_tokens, where present, is [verifier_vocab, hidden] for EAGLE-3/P-EAGLE")
def embed_tokens(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.family != Family.EAGLE:
        return
    emb, h, v = ck.tensor("embed_tokens.weight"), ck.hidden_size, ck.verifier_vocab_size
    if emb is not None and h is not None and v is not None and list(emb.shape) != [v, h]:
        yield f"embed_tokens.weight is {list(emb.shape)}, expected [{v}, {h}] (verifier vocab x hidden)"


# vLLM 0.32.0 loads an EAGLE draft without embed_tokens (llama_eagle3.py load_weights maps it away) and then
# shares the verifier's embedding with it (v1/spec_decode/llm_base_proposer.py _maybe_share_embeddings,
# "EAGLE model without its own embed_tokens"): SafeAILab's EAGLE-3 checkpoints ship none, and speculators'
# convert keeps it so. speculators' own trainer saves a frozen copy of the verifier's.
@rule("embed-tokens-shared", Severity.INFO, "an EAGLE draft without embed_tokens is served on the verifier's")
def embed_tokens_shared(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.family == Family.EAGLE and ck.tensor("embed_tokens.weight") is None:
        yield "embed_tokens.weight is absent: vLLM shares the verifier's embedding with the draft"


@rule("vocab-maps", Severity.ERROR, "t2d (bool [V]) and d2t (int64 [Vd]) exist exactly when the vocab is pruned")
def vocab_maps(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.family not in (Family.EAGLE, Family.DFLASH):
        return
    vd, v = ck.draft_vocab_size, ck.verifier_vocab_size
    if vd is None or v is None:
        if ck.algorithm != Algorithm.MTP:
            yield f"draft_vocab_size ({vd!r}) or transformer_layer_config.vocab_size ({v!r}) is missing"
        return
    t2d, d2t = ck.tensor("t2d"), ck.tensor("d2t")
    if vd > v:
        yield f"draft_vocab_size {vd} is larger than the verifier vocab {v}"
    if vd == v:
        for name, t in (("t2d", t2d), ("d2t", d2t)):
            if t is not None:
                yield f"{name} is present although draft_vocab_size equals the verifier vocab ({v})"
        return
    if t2d is None:
        yield f"t2d is missing: draft_vocab_size {vd} < verifier vocab {v} needs the vocab map"
    elif t2d.dtype != "BOOL" or list(t2d.shape) != [v]:
        yield f"t2d is {t2d.dtype} {list(t2d.shape)}, expected BOOL [{v}]"
    if d2t is None:
        yield f"d2t is missing: draft_vocab_size {vd} < verifier vocab {v} needs the vocab map"
    elif d2t.dtype != "I64" or list(d2t.shape) != [vd]:
        yield f"d2t is {d2t.dtype} {list(d2t.shape)}, expected I64 [{vd}]"


@rule("layer0-attention", Severity.ERROR, "layer 0 q/k/v take 2H (EAGLE-3/P-EAGLE) or H (DFlash family)")
def layer0_attention(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    h = ck.hidden_size
    if ck.family not in (Family.EAGLE, Family.DFLASH) or h is None:
        return
    want = 2 * h if ck.family == Family.EAGLE else h
    for proj in ("q_proj", "k_proj", "v_proj"):
        t = ck.tensor(f"layers.0.self_attn.{proj}.weight")
        if t is None:
            yield f"layers.0.self_attn.{proj}.weight is missing"
        elif len(t.shape) != 2 or t.shape[1] != want:
            why = "2 x hidden: token embedding and fc output" if ck.family == Family.EAGLE else "hidden"
            yield f"layers.0.self_attn.{proj}.weight is {list(t.shape)}; in-features must be {want} ({why})"


@rule("layer-count", Severity.ERROR, "the checkpoint has exactly num_hidden_layers decoder layers")
def layer_count(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.family not in (Family.EAGLE, Family.DFLASH):
        return
    n = ck.num_layers
    found = ck.layer_indices()
    if n is None:
        yield "transformer_layer_config.num_hidden_layers is missing"
    elif found != set(range(n)):
        yield f"num_hidden_layers is {n} but the tensors hold layers {sorted(found)}"
