"""The audit of a stitched MTP model: a verifier whose own MTP layers were fine-tuned by speculators and
written back into it by `speculators stitch-mtp` (or that ships them, as Qwen3-Next and Qwen3.5 do). It is no
speculators checkpoint (no speculators_model_type): vLLM serves it as the target model with
`{"method": "mtp", "num_speculative_tokens": K}` and no draft model.

Facts (vLLM 0.32.0, config/speculative.py `hf_config_override`; speculators 0.9.0 cli/stitch.py and
convert/mtp/converter.py):
- model_type qwen3_next is served by Qwen3NextMTP with n_predict = num_nextn_predict_layers; qwen3_5,
  qwen3_5_text, qwen3_5_moe and qwen3_5_moe_text by Qwen3_5(Moe)MTP with n_predict = mtp_num_hidden_layers
  (the text config's, for a multimodal config); these are also the families speculators fine-tunes;
- the MTP weights sit under `mtp.`: `fc` [H, 2H] (the embedding and the hidden state concatenated),
  `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm` [H] and one decoder layer per n_predict under
  `mtp.layers.<i>.`;
- a K above n_predict must be a multiple of it (vLLM reuses the layers in turn).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from speculator_operator.domain.algorithms import MTP_COUNT_KEY
from speculator_operator.domain.checkpoint.rules import AuditContext, Finding, Severity

NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")


def _text(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def findings(ctx: AuditContext, speculative_tokens: int | None = None) -> list[Finding]:
    """Every stitched-model rule; `speculative_tokens` is the K it is to be served with, when known."""
    out: list[Finding] = []
    for rule, severity, check in _RULES:
        out += [Finding(rule, severity, message) for message in check(ctx, speculative_tokens)]
    return out


def _family(ctx: AuditContext, _k: int | None) -> Iterator[str]:
    kind = ctx.checkpoint.model_type
    if kind not in MTP_COUNT_KEY:
        yield (
            f"model_type {kind!r} is not one speculators fine-tunes and vLLM serves with method mtp "
            f"({', '.join(sorted(MTP_COUNT_KEY))})"
        )


def _layers(ctx: AuditContext, _k: int | None) -> Iterator[str]:
    ck = ctx.checkpoint
    count = ck.mtp_layers
    if ck.model_type not in MTP_COUNT_KEY:
        return
    key = MTP_COUNT_KEY[ck.model_type or ""]
    if count is None or count < 1:
        yield f"{key} is {count!r}: vLLM builds no MTP layer to serve"
        return
    found = {int(n.split(".")[2]) for n in ck.tensors if n.startswith("mtp.layers.") and n.split(".")[2].isdigit()}
    missing = sorted(set(range(count)) - found)
    if missing:
        yield f"{key} is {count} but the weights hold no mtp.layers.{missing[0]}.*"
    extra = sorted(found - set(range(count)))
    if extra:
        yield f"mtp.layers.{extra[0]}.* is beyond {key} = {count}: vLLM would not load it"


def _names(ctx: AuditContext, _k: int | None) -> Iterator[str]:
    """A causal LM of these families holds `model.*`, `lm_head.*` and `mtp.*`: vLLM refuses any other name
    ("There is no module or parameter named ..."), e.g. the `verifier_lm_head` speculators' MTP converter
    saves and stitch-mtp carries over."""
    stray = sorted(n for n in ctx.checkpoint.tensors if not n.startswith(("model.", "lm_head.", "mtp.")))
    if stray:
        yield f"{len(stray)} tensor(s) vLLM has no parameter for, e.g. {stray[0]!r}: it refuses to load the model"


def _shapes(ctx: AuditContext, _k: int | None) -> Iterator[str]:
    ck = ctx.checkpoint
    hidden = _int(_text(ck.config).get("hidden_size"))
    fc = ck.tensor("mtp.fc.weight")
    if fc is None:
        yield "mtp.fc.weight is missing"
    elif hidden is not None and list(fc.shape) != [hidden, 2 * hidden]:
        yield f"mtp.fc.weight is {list(fc.shape)}, expected [{hidden}, {2 * hidden}] (embedding ‖ hidden state)"
    for name in NORMS:
        norm = ck.tensor(name)
        if norm is None:
            yield f"{name} is missing"
        elif hidden is not None and list(norm.shape) != [hidden]:
            yield f"{name} is {list(norm.shape)}, expected [{hidden}]"


def _verifier(ctx: AuditContext, _k: int | None) -> Iterator[str]:
    """The stitched model is the verifier with new MTP weights: everything else about it is the verifier's."""
    if ctx.verifier is None:
        return
    ours, theirs = _text(ctx.checkpoint.config), ctx.verifier_text
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
        if key in theirs and ours.get(key) != theirs.get(key):
            yield f"{key} is {ours.get(key)!r}, the verifier's is {theirs.get(key)!r}: stitched into another model"


def _tokens(ctx: AuditContext, k: int | None) -> Iterator[str]:
    count = ctx.checkpoint.mtp_layers
    if k is None or count is None or count < 1:
        return
    if k > count and k % count:
        yield f"num_speculative_tokens {k} is above n_predict {count} and not a multiple of it (vLLM refuses it)"


def _served(ctx: AuditContext, _k: int | None) -> Iterator[str]:
    if ctx.checkpoint.model_type in MTP_COUNT_KEY:
        yield 'served as the target model with {"method": "mtp"} and no draft model (not loadable as a draft)'


_RULES = (
    ("mtp-stitched-family", Severity.ERROR, _family),
    ("mtp-stitched-layers", Severity.ERROR, _layers),
    ("mtp-stitched-shapes", Severity.ERROR, _shapes),
    ("mtp-stitched-names", Severity.ERROR, _names),
    ("mtp-stitched-verifier", Severity.ERROR, _verifier),
    ("mtp-stitched-tokens", Severity.ERROR, _tokens),
    ("mtp-stitched-served", Severity.INFO, _served),
)
