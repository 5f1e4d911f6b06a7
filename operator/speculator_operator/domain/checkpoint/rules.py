"""Audit rules: one small registered function each, with an id and a severity.

A rule gets the AuditContext and yields messages (which take the rule's severity) or Findings (to
choose another severity). Messages name the values seen. The facts behind the rules are in
docs/reference/speculators.md §2-§3 and docs/reference/vllm.md §1-§3.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any, TypeGuard

from speculator_operator.domain.algorithms import (
    KNOWN,
    MTP_TRAINABLE_VERIFIERS,
    Algorithm,
    Family,
    in_family,
    needs_mask_token,
)
from speculator_operator.domain.checkpoint.manifest import PROVENANCE, select
from speculator_operator.domain.checkpoint.model import Checkpoint
from speculator_operator.domain.checkpoint.safetensors_header import TensorInfo
from speculator_operator.domain.location import Location
from speculator_operator.domain.releases import VLLM_ALGORITHMS, VLLM_FEATURES, Version, supports

KNOWN_TYPES = KNOWN
EAGLE_DECODERS = ("llama", "qwen3")
MTP_VERIFIER_TYPES = MTP_TRAINABLE_VERIFIERS
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": str(self.severity), "message": self.message}


@dataclass
class AuditContext:
    checkpoint: Checkpoint
    verifier: dict[str, Any] | None = None  # the verifier's config.json
    served_verifier: str | None = None  # the verifier name/uri that will be served
    verifier_revision: str | None = None  # its resolved revision (hub commit sha, s3 listing digest)
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads (Source.content)
    vllm: Version | None = None
    allow_lossy: bool = False
    deep: bool = False
    declared: tuple[str | None, int | None] = (None, None)  # the spec's speculator.algorithm/speculativeTokens
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def verifier_text(self) -> dict[str, Any]:
        """The verifier's text config (multimodal verifiers nest it under text_config)."""
        if self.verifier is None:
            return {}
        text = self.verifier.get("text_config")
        return text if isinstance(text, dict) else self.verifier

    def verifier_int(self, key: str) -> int | None:
        value = self.verifier_text.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


RuleFn = Callable[[AuditContext], Iterable["str | Finding"]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str
    fn: RuleFn
    needs: str = ""  # "verifier", "vllm" or "deep": skipped without it


RULES: list[Rule] = []


def rule(rule_id: str, severity: Severity, summary: str, needs: str = "") -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        if any(r.id == rule_id for r in RULES):
            raise ValueError(f"duplicate audit rule id {rule_id}")
        RULES.append(Rule(rule_id, severity, summary, fn, needs))
        return fn

    return register


def run_rules(ctx: AuditContext) -> list[Finding]:
    findings: list[Finding] = []
    for r in RULES:
        if r.needs == "verifier" and ctx.verifier is None:
            continue
        if r.needs == "vllm" and ctx.vllm is None:
            continue
        if r.needs == "deep" and not ctx.deep:
            continue
        try:
            for item in r.fn(ctx):
                findings.append(item if isinstance(item, Finding) else Finding(r.id, r.severity, item))
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            findings.append(Finding(r.id, Severity.ERROR, f"could not be checked: {type(exc).__name__}: {exc}"))
    return findings


# ------------------------------------------------------------------------------------------ helpers


def _shape(t: TensorInfo | None) -> list[int] | None:
    return None if t is None else list(t.shape)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _aux_count(ck: Checkpoint) -> int | None:
    """How many aux hidden states the fc layer concatenates (each family's default applied)."""
    ids = ck.config.get(ck.aux_ids_key)
    if ck.family == Family.EAGLE:
        return len(ids) if isinstance(ids, list) and ids else 3
    if ck.family == Family.DFLASH:
        return len(ids) if isinstance(ids, list) else None
    return None


def _known(ck: Checkpoint) -> bool:
    return ck.algorithm in KNOWN_TYPES


# ------------------------------------------------------------------------------ format of the draft


@rule("model-type", Severity.ERROR, "speculators_model_type is one speculators 0.9.0 knows")
def model_type(ctx: AuditContext) -> Iterator[str]:
    value = ctx.checkpoint.config.get("speculators_model_type")
    if value is None:
        yield "config.json has no speculators_model_type: not a speculators checkpoint"
    elif value not in KNOWN_TYPES:
        yield f"speculators_model_type {value!r} is not one of {', '.join(KNOWN_TYPES)}"


@rule("config-structure", Severity.ERROR, "the keys vLLM needs to load a speculators config are present")
def config_structure(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if not isinstance(ck.config.get("transformer_layer_config"), dict):
        yield "transformer_layer_config is missing or not an object"
    if not isinstance(ck.config.get("speculators_config"), dict):
        yield "speculators_config is missing or not an object"
        return
    methods = ck.speculators_config.get("proposal_methods")
    if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
        yield "speculators_config.proposal_methods must be a non-empty list of objects"
    verifier = ck.speculators_config.get("verifier")
    if not isinstance(verifier, dict) or not isinstance(verifier.get("name_or_path"), str):
        yield "speculators_config.verifier.name_or_path is missing"
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
        if key in ck.layer_config and not _is_int(ck.layer_config[key]):
            yield f"transformer_layer_config.{key} must be an integer, got {ck.layer_config[key]!r}"
        elif key in ck.layer_config and ck.layer_config[key] <= 0:
            yield f"transformer_layer_config.{key} must be positive, got {ck.layer_config[key]}"


@rule("proposal", Severity.ERROR, "the proposal config is sane (greedy, K >= 1, default method exists)")
def proposal(ctx: AuditContext) -> Iterator[str]:
    sc = ctx.checkpoint.speculators_config
    methods = sc.get("proposal_methods")
    if not isinstance(methods, list) or not methods:
        return
    types = [m.get("proposal_type") for m in methods if isinstance(m, dict)]
    default = sc.get("default_proposal_method")
    if default not in types:
        yield f"default_proposal_method {default!r} is not among the proposal types {types}"
    p = ctx.checkpoint.proposal
    k = p.get("speculative_tokens")
    if not _is_int(k) or k < 1:
        yield f"proposal_methods[0].speculative_tokens must be an integer >= 1, got {k!r}"
    accept_k = p.get("verifier_accept_k", 1)
    if not _is_int(accept_k) or accept_k < 1:
        yield f"proposal_methods[0].verifier_accept_k must be an integer >= 1, got {accept_k!r}"
    tol = p.get("accept_tolerance", 0.0)
    if not isinstance(tol, int | float) or isinstance(tol, bool) or math.isnan(tol) or tol < 0:
        yield f"proposal_methods[0].accept_tolerance must be >= 0, got {tol!r}"


@rule("lossless", Severity.ERROR, "the proposal is lossless unless lossy proposals are explicitly allowed")
def lossless(ctx: AuditContext) -> Iterator[Finding]:
    p = ctx.checkpoint.proposal
    accept_k, tol = p.get("verifier_accept_k", 1), p.get("accept_tolerance", 0.0)
    lossy = []
    if _is_int(accept_k) and accept_k > 1:
        lossy.append(f"verifier_accept_k={accept_k}")
    if isinstance(tol, int | float) and not isinstance(tol, bool) and tol > 0:
        lossy.append(f"accept_tolerance={tol}")
    if lossy:
        severity = Severity.WARNING if ctx.allow_lossy else Severity.ERROR
        suffix = " (allowed by --allow-lossy)" if ctx.allow_lossy else "; pass --allow-lossy to accept it"
        yield Finding("lossless", severity, f"lossy proposal: {', '.join(lossy)} changes the output{suffix}")


@rule("decoder-family", Severity.ERROR, "EAGLE-3/P-EAGLE drafts use a llama or qwen3 decoder layer")
def decoder_family(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.family != Family.EAGLE:
        return
    model_type = ck.layer_config.get("model_type")
    if model_type not in EAGLE_DECODERS:
        yield f"transformer_layer_config.model_type is {model_type!r}; {ck.algorithm} needs one of {EAGLE_DECODERS}"
    if ck.config.get("norm_before_fc") is True and ck.config.get("fc_norm") is True:
        yield "norm_before_fc and fc_norm are both true; speculators forbids the pair"


@rule("hidden-size", Severity.ERROR, "the draft's hidden size is a positive integer and its heads divide")
def hidden_size(ctx: AuditContext) -> Iterator[str]:
    lc = ctx.checkpoint.layer_config
    if not _known(ctx.checkpoint) or ctx.checkpoint.algorithm == Algorithm.MTP:
        return
    h, heads, kv = lc.get("hidden_size"), lc.get("num_attention_heads"), lc.get("num_key_value_heads")
    if not _is_int(h):
        yield f"transformer_layer_config.hidden_size is {h!r}"
    if _is_int(heads) and _is_int(kv) and kv > 0 and heads % kv:
        yield f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"
    target = ctx.checkpoint.config.get("target_hidden_size")
    if target is not None and target != h:
        yield f"target_hidden_size {target!r} differs from hidden_size {h!r}; CLI-trained drafts leave it null"


@rule("aux-layer-ids", Severity.ERROR, "aux hidden-state layer ids are present where required, distinct, >= 0")
def aux_layer_ids(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.family not in (Family.EAGLE, Family.DFLASH):
        return
    key = ck.aux_ids_key
    ids = ck.config.get(key)
    if ids is None or ids == []:
        if ck.family == Family.DFLASH:
            yield f"{key} is missing: {ck.algorithm} has no default and vLLM requires it"
        return
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        yield f"{key} must be a list of integers, got {ids!r}"
        return
    if len(set(ids)) != len(ids):
        yield f"{key} {ids} has duplicates"
    if any(i < 0 for i in ids):
        yield f"{key} {ids} has negative layer ids"


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


@rule("speculative-tokens", Severity.ERROR, "speculative_tokens matches the algorithm's own parameters")
def speculative_tokens(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    k = ck.speculative_tokens
    if k is None:
        return
    cfg = ck.config
    if in_family(ck.algorithm, Family.DFLASH):
        block = cfg.get("block_size")
        if not _is_int(block) or block < 2:
            yield f"block_size must be an integer >= 2, got {block!r}"
            return
        default_anchor = ck.algorithm == Algorithm.DSPARK
        anchor = cfg.get("sample_from_anchor", default_anchor)
        want = block if anchor else block - 1
        if k != want:
            how = "sample_from_anchor is true" if anchor else "sample_from_anchor is false or absent"
            yield f"speculative_tokens is {k} with block_size {block}; {how}, so it must be {want}"
    elif ck.algorithm == Algorithm.EAGLE3 and _is_int(cfg.get("ttt_steps")) and cfg["ttt_steps"] != k:
        yield f"speculative_tokens is {k} but ttt_steps is {cfg['ttt_steps']}"
    elif ck.algorithm == Algorithm.PEAGLE and _is_int(cfg.get("num_depths")) and cfg["num_depths"] != k:
        yield f"speculative_tokens is {k} but num_depths is {cfg['num_depths']}"
    elif (
        ck.algorithm == Algorithm.MTP
        and _is_int(cfg.get("num_speculative_steps"))
        and cfg["num_speculative_steps"] != k
    ):
        yield f"speculative_tokens is {k} but num_speculative_steps is {cfg['num_speculative_steps']}"


@rule("declared-draft", Severity.ERROR, "the checkpoint is the algorithm the deployment declares (and its K)")
def declared_draft(ctx: AuditContext) -> Iterator[str | Finding]:
    ck = ctx.checkpoint
    algorithm, tokens = ctx.declared
    # an MTP head stitched into its verifier is served as mtp with its layer count as K (render/serving.py)
    found = (Algorithm.MTP.value, ck.mtp_layers) if ck.stitched_mtp else (ck.algorithm, ck.speculative_tokens)
    if algorithm is not None and found[0] != algorithm:
        yield f"speculator.algorithm is {algorithm} but the checkpoint is {found[0]}"
    if tokens is not None and found[1] != tokens:
        # a warning: K as served follows serving.numSpeculativeTokens (auto: the checkpoint's), so a stale
        # declaration misleads only an offline render
        yield Finding("declared-draft", Severity.WARNING, f"speculator.speculativeTokens is {tokens} but the "
                      f"checkpoint's is {found[1]}: auto serves the checkpoint's")  # fmt: skip


@rule("mask-token", Severity.ERROR, "P-EAGLE and DFlash-family drafts carry the mask_token_id vLLM requires")
def mask_token(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if needs_mask_token(ck.algorithm) and not _is_int(ck.config.get("mask_token_id")):
        yield f"mask_token_id is {ck.config.get('mask_token_id')!r}; vLLM requires it for {ck.algorithm}"


@rule("algorithm-specific", Severity.ERROR, "dflash2, dspark and mtp constraints")
def algorithm_specific(ctx: AuditContext) -> Iterator[str]:
    ck, cfg = ctx.checkpoint, ctx.checkpoint.config
    v = ck.verifier_vocab_size
    if ck.algorithm == Algorithm.DFLASH2 and v is not None:
        if ck.draft_vocab_size is not None and ck.draft_vocab_size != v:
            yield f"dflash2 needs the full vocabulary: draft_vocab_size {ck.draft_vocab_size} != {v}"
        top_k = cfg.get("selector_top_k")
        if _is_int(top_k) and top_k > v:
            yield f"selector_top_k {top_k} exceeds the vocabulary {v}"
    if (
        ck.algorithm == Algorithm.DSPARK
        and cfg.get("enable_confidence_head", True)
        and cfg.get("confidence_head_with_markov", True)
        and _is_int(cfg.get("markov_rank"))
        and cfg["markov_rank"] <= 0
    ):
        yield f"dspark: confidence_head_with_markov needs markov_rank > 0, got {cfg['markov_rank']}"
    if ck.algorithm == Algorithm.MTP and cfg.get("num_nextn_predict_layers", 1) != 1:
        yield f"mtp: num_nextn_predict_layers must be 1, got {cfg.get('num_nextn_predict_layers')!r}"


@rule("dtype", Severity.WARNING, "trainer checkpoints are bfloat16")
def dtype(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    declared = ck.config.get("dtype", ck.config.get("torch_dtype"))
    if declared is not None and declared != "bfloat16":
        yield f"config dtype is {declared!r}; speculators trainer checkpoints are bfloat16"
    odd = sorted({t.dtype for t in ck.tensors.values() if t.dtype in FLOAT_DTYPES and t.dtype != "BF16"})
    if odd:
        yield f"floating tensors stored as {', '.join(odd)} besides BF16"


# ------------------------------------------------------------------------------ against the verifier


@rule("verifier-hidden-size", Severity.ERROR, "draft and verifier hidden sizes agree", needs="verifier")
def verifier_hidden_size(ctx: AuditContext) -> Iterator[str | Finding]:
    h, vh = ctx.checkpoint.hidden_size, ctx.verifier_int("hidden_size")
    if vh is None:
        yield Finding("verifier-hidden-size", Severity.WARNING, "the verifier config has no hidden_size")
    elif h is not None and h != vh:
        yield f"draft hidden_size {h} != verifier hidden_size {vh}"


@rule("verifier-vocab", Severity.ERROR, "draft and verifier vocabularies agree", needs="verifier")
def verifier_vocab(ctx: AuditContext) -> Iterator[str | Finding]:
    v, vv = ctx.checkpoint.verifier_vocab_size, ctx.verifier_int("vocab_size")
    if vv is None:
        yield Finding("verifier-vocab", Severity.WARNING, "the verifier config has no vocab_size")
        return
    if v is not None and v != vv:
        yield f"the draft was built for a vocabulary of {v} but the verifier has {vv}"
    emb = ctx.checkpoint.tensor("embed_tokens.weight")
    if emb is not None and emb.shape and emb.shape[0] != vv:
        yield f"embed_tokens.weight has {emb.shape[0]} rows, the verifier vocabulary is {vv}"


@rule("verifier-layers", Severity.ERROR, "aux layer ids lie within the verifier's layers [0, L]", needs="verifier")
def verifier_layers(ctx: AuditContext) -> Iterator[str]:
    ck, layers = ctx.checkpoint, ctx.verifier_int("num_hidden_layers")
    ids = ck.aux_layer_ids
    if layers is None or not ids:
        return
    outside = [i for i in ids if i > layers]
    if outside:
        yield f"{ck.aux_ids_key} {ids}: {outside} beyond the verifier's {layers} layers (valid: 0..{layers})"


@rule("verifier-architecture", Severity.ERROR, "the recorded verifier architecture is the served one", needs="verifier")
def verifier_architecture(ctx: AuditContext) -> Iterator[str]:
    recorded = ctx.checkpoint.recorded_verifier.get("architectures")
    served = ctx.verifier.get("architectures") if ctx.verifier else None
    if (
        isinstance(recorded, list)
        and recorded
        and isinstance(served, list)
        and served
        and not set(recorded) & set(served)
    ):
        yield f"the draft was trained against {recorded}, the verifier is {served}"
    if ctx.checkpoint.algorithm == Algorithm.MTP:
        model_type = ctx.verifier_text.get("model_type")
        if model_type not in MTP_VERIFIER_TYPES:
            yield f"mtp needs a verifier with native MTP layers ({', '.join(MTP_VERIFIER_TYPES)}), got {model_type!r}"


@rule("verifier-name", Severity.WARNING, "the recorded verifier name is the one being served")
def verifier_name(ctx: AuditContext) -> Iterator[str | Finding]:
    recorded = ctx.checkpoint.recorded_verifier.get("name_or_path")
    if not isinstance(recorded, str):
        return
    if PurePosixPath(recorded).is_absolute():
        yield Finding(
            "verifier-name",
            Severity.INFO,
            f"the recorded verifier is a local path ({recorded}); serve with the long form and an explicit verifier",
        )
    served = ctx.served_verifier
    where = Location.parse(served or "")
    name = where.root if where.is_hub else (served or "").split("@")[0]
    if served and name.rstrip("/") != recorded.rstrip("/"):
        yield f"the draft records verifier {recorded!r} but {served!r} is being served (fine for a quantized "
        "or re-hosted copy of the same model; otherwise acceptance will collapse)"


@rule(
    "verifier-revision",
    Severity.ERROR,
    "the draft was trained for the verifier revision being served",
    needs="verifier",
)
def verifier_revision(ctx: AuditContext) -> Iterator[str | Finding]:
    """The structural rules cannot see a draft trained for another revision of the same model; the
    publish record can. A README-only hub commit moves the sha but not the content identity."""
    record = ctx.checkpoint.provenance or {}
    recorded, content, name = record.get("verifierRevision"), record.get("verifierContent"), record.get("verifier")
    served = ctx.served_verifier or "the served verifier"
    if not isinstance(recorded, str) or not recorded:
        if ctx.verifier_revision is not None:
            yield Finding(
                "verifier-revision",
                Severity.WARNING,
                f"no {PROVENANCE} records which verifier revision the draft was trained for: "
                f"its pairing with {served}@{ctx.verifier_revision} is unproven",
            )
        return
    if ctx.verifier_revision is None:
        yield Finding(
            "verifier-revision",
            Severity.WARNING,
            f"the draft was trained for {name}@{recorded} ({PROVENANCE}); "
            f"the revision of {served} is not known here: the pairing is unproven",
        )
    elif recorded != ctx.verifier_revision and not (content and content == ctx.verifier_content):
        yield (
            f"the draft was trained for verifier {name}@{recorded} ({PROVENANCE}) but {served} is at "
            f"{ctx.verifier_revision}: train a draft for this revision, or serve the one it was trained for"
        )


@rule("provenance", Severity.ERROR, "the publish record beside the draft is readable and names exactly its files")
def provenance(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.provenance_error:
        yield f"{PROVENANCE} is there but unusable: {ck.provenance_error}"
    files = (ck.provenance or {}).get("files")
    if ck.manifest is None or not isinstance(files, dict):
        return
    present = {f.name: f for f in ck.manifest.files if f.name != PROVENANCE}
    missing = sorted(set(select(files, "draft")) - set(present))
    if missing:
        yield f"{PROVENANCE} names {', '.join(missing)}, which the checkpoint does not hold"
    extra = sorted(set(present) - set(files))
    if extra:
        yield f"{', '.join(extra)} not named by {PROVENANCE}: added after the checkpoint was published"
    for name, entry in present.items():
        recorded = files.get(name)
        size = recorded.get("size") if isinstance(recorded, dict) else None
        if _is_int(size) and entry.size != size:
            yield f"{name} is {entry.size} bytes, {PROVENANCE} recorded {size}: replaced after the publish"


# ------------------------------------------------------------------------------ against the pinned vLLM


@rule("vllm-loadable", Severity.ERROR, "the pinned vLLM can load this algorithm as a draft", needs="vllm")
def vllm_loadable(ctx: AuditContext) -> Iterator[str]:
    algo, vllm = ctx.checkpoint.algorithm, ctx.vllm
    assert vllm is not None
    if algo == Algorithm.MTP:
        yield "an mtp checkpoint is not loadable as a draft: run `speculators stitch-mtp` into the verifier and "
        'serve that with {"method": "mtp"}'
    elif algo == Algorithm.XPRESS:
        yield f"vLLM {vllm} has no xpress drafter"
    elif algo in VLLM_ALGORITHMS and (refusal := VLLM_ALGORITHMS[algo].why_not(vllm, algo)):
        yield refusal


@rule("vllm-features", Severity.ERROR, "the pinned vLLM honours every feature the checkpoint uses", needs="vllm")
def vllm_features(ctx: AuditContext) -> Iterator[str]:
    ck, vllm = ctx.checkpoint, ctx.vllm
    assert vllm is not None
    used = []
    if ck.family == Family.EAGLE:
        if ck.layer_config.get("model_type") == "qwen3":
            used.append(("eagle3-qwen3-decoder", "a qwen3 decoder layer"))
        for key in ("norm_before_fc", "fc_norm", "norm_output"):
            if ck.config.get(key) is True:
                used.append((key, f"{key}: true"))
    if in_family(ck.algorithm, Family.DFLASH) and "sliding_window_non_causal" in ck.config:
        used.append(("sliding_window_non_causal", "sliding_window_non_causal"))
    if ck.algorithm == Algorithm.DSPARK and ck.config.get("sample_from_anchor") is not None:
        used.append(("sample_from_anchor", "sample_from_anchor"))
    for feature, what in used:
        why = VLLM_FEATURES[feature].why_not(vllm, what)  # the span's both ends: a later vLLM may drop it again
        if why:
            yield f"{why}: it would ignore it and serve a different model"


@rule("vllm-defaults", Severity.ERROR, "absent keys that vLLM reads differently from speculators", needs="vllm")
def vllm_defaults(ctx: AuditContext) -> Iterator[str | Finding]:
    ck, cfg = ctx.checkpoint, ctx.checkpoint.config
    if ck.algorithm == Algorithm.EAGLE3 and "norm_before_residual" not in cfg:
        yield "norm_before_residual is absent: speculators reads it as false, vLLM serves it as true"
    if ck.algorithm in (Algorithm.DFLASH, Algorithm.DSPARK) and "sliding_window_non_causal" not in cfg:
        yield (
            "sliding_window_non_causal is absent: speculators reads it as false (causal), vLLM serves every "
            "draft layer non-causal"
        )
    if ck.family == Family.EAGLE and not ck.config.get(ck.aux_ids_key):
        layers = ctx.verifier_int("num_hidden_layers")
        served = f"({2}, {layers // 2}, {layers - 3})" if layers else "(2, L//2, L-3) of the verifier"
        yield Finding(
            "vllm-defaults",
            Severity.WARNING,
            f"{ck.aux_ids_key} is absent: vLLM serves the draft against layers {served}; "
            "acceptance collapses if it was trained on others",
        )


def _full_attention_layers(ck: Checkpoint) -> list[int] | None:
    """The draft layers vLLM serves with full attention, from transformer_layer_config.layer_types (None when
    it names no layer types)."""
    types = ck.layer_config.get("layer_types")
    if not isinstance(types, list):
        return None
    return [i for i, kind in enumerate(types) if kind != "sliding_attention"]


# DFlash attention, speculators 0.9.0 against vLLM 0.32.0 (the decision behind serving DFlash2):
# - speculators (models/dflash/attention.py): a full-attention layer is always non-causal inside the query
#   block; a sliding-window layer is non-causal exactly when sliding_window_non_causal (dflash2's default);
# - vLLM (transformers_utils/configs/speculators/algos.py update_dflash): dflash_config.causal = not
#   sliding_window_non_causal, applied to every draft layer (qwen3_dflash.py _dflash_layer_causal), with each
#   layer's window from layer_types and sliding_window (_resolve_layer_attention).
# They agree but where the flag is false and a layer has full attention: vLLM runs that layer causal.
@rule("vllm-servable", Severity.ERROR, "options the pinned vLLM cannot serve", needs="vllm")
def vllm_servable(ctx: AuditContext) -> Iterator[str]:
    ck, cfg = ctx.checkpoint, ctx.checkpoint.config
    full = _full_attention_layers(ck) if in_family(ck.algorithm, Family.DFLASH) else None
    if full and cfg.get("sliding_window_non_causal") is False:
        yield (
            f"sliding_window_non_causal is false: vLLM {ctx.vllm} serves every draft layer causal, but speculators "
            f"trained full-attention layer(s) {full} non-causal"
        )
    if ck.algorithm in (Algorithm.DFLASH, Algorithm.DFLASH2) and cfg.get("sample_from_anchor") is True:
        yield f"sample_from_anchor is true: vLLM {ctx.vllm}'s DFlash drafter rejects it"


@rule("vllm-runner", Severity.INFO, "what needs vLLM's V2 model runner (the default where Triton is)", needs="vllm")
def vllm_runner(ctx: AuditContext) -> Iterator[str]:
    """vLLM 0.32.0 config/vllm.py _get_v1_model_runner_unsupported_features: its V1 runner refuses these at
    start-up (a DFlash2 would otherwise draft without its candidate head, silently)."""
    ck = ctx.checkpoint
    if not in_family(ck.algorithm, Family.DFLASH):
        return
    needs = []
    if ck.algorithm == Algorithm.DFLASH2:
        needs.append("the candidate head of a DFlash2 draft")
    full = _full_attention_layers(ck)
    if full and ck.num_layers is not None and len(full) < ck.num_layers:
        needs.append("mixed sliding-window and full-attention layers")
    if ck.algorithm == Algorithm.DSPARK:
        needs.append("a DSpark draft")
    assert ctx.vllm is not None
    if needs and supports(ctx.vllm, "model_runner_v1"):  # from 0.34.0 the V2 runner is the only one
        yield (
            f"{'; '.join(needs)}: served by vLLM {ctx.vllm}'s V2 model runner only (its default where Triton is, "
            "as on GPUs); the V1 runner refuses the draft at start-up"
        )


# ------------------------------------------------------------------------------ --deep: tensor data

SAMPLE_BYTES = 64 * 1024


def _bf16_or_f16_nan(data: bytes, dtype: str) -> tuple[int, int]:
    """(NaN count, non-zero count) of a little-endian BF16/F16/F32 buffer."""
    if dtype == "F32":
        values = struct.unpack(f"<{len(data) // 4}I", data[: len(data) // 4 * 4])
        exp, mant = 0x7F800000, 0x007FFFFF
    else:
        values = struct.unpack(f"<{len(data) // 2}H", data[: len(data) // 2 * 2])
        exp, mant = (0x7F80, 0x007F) if dtype == "BF16" else (0x7C00, 0x03FF)
    nans = sum(1 for x in values if x & exp == exp and x & mant)
    nonzero = sum(1 for x in values if x & (exp | mant))  # anything but +0 / -0
    return nans, nonzero


def _samples(ctx: AuditContext, t: TensorInfo) -> bytes:
    """The whole tensor if small, else three slices of it (start, middle, end), by ranged reads."""
    read = ctx.checkpoint.source.read_range
    if t.nbytes <= 3 * SAMPLE_BYTES:
        return read(t.file, t.start, t.nbytes)[0]
    out = b""
    for frac in (0.0, 0.5, 1.0):
        start = t.start + int((t.nbytes - SAMPLE_BYTES) * frac) // 4 * 4  # element-aligned (2- and 4-byte types)
        out += read(t.file, start, SAMPLE_BYTES)[0]
    return out


@rule("deep-loaded", Severity.ERROR, "lm_head/embed_tokens hold real weights (not NaN, not all zero)", needs="deep")
def deep_loaded(ctx: AuditContext) -> Iterator[str]:
    for name in ("lm_head.weight", "embed_tokens.weight", "fc.weight"):
        t = ctx.checkpoint.tensor(name)
        if t is None or t.dtype not in ("BF16", "F16", "F32") or t.nbytes == 0:
            continue
        nans, nonzero = _bf16_or_f16_nan(_samples(ctx, t), t.dtype)
        if nans:
            yield f"{name}: {nans} NaN values in the sampled rows: the weights were never loaded or diverged"
        elif nonzero == 0:
            yield f"{name}: the sampled rows are all zero: the weights were never loaded"


@rule("deep-vocab-map", Severity.ERROR, "t2d marks exactly draft_vocab_size tokens; d2t is increasing", needs="deep")
def deep_vocab_map(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    t2d, d2t, vd = ck.tensor("t2d"), ck.tensor("d2t"), ck.draft_vocab_size
    if t2d is not None and t2d.dtype == "BOOL" and vd is not None and t2d.nbytes <= 64 * 1024 * 1024:
        data, _ = ck.source.read_range(t2d.file, t2d.start, t2d.nbytes)
        marked = sum(1 for b in data if b)
        if marked != vd:
            yield f"t2d marks {marked} tokens, draft_vocab_size is {vd}"
    if d2t is not None and d2t.dtype == "I64" and d2t.nbytes <= 64 * 1024 * 1024:
        data, _ = ck.source.read_range(d2t.file, d2t.start, d2t.nbytes)
        offsets = struct.unpack(f"<{len(data) // 8}q", data[: len(data) // 8 * 8])
        targets = [i + o for i, o in enumerate(offsets)]
        if any(o < 0 for o in offsets) or any(b <= a for a, b in itertools.pairwise(targets)):
            yield "d2t offsets do not map draft ids to strictly increasing verifier ids"
