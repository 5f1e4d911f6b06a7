"""Rules against the pinned vLLM release: whether it loads the algorithm as a draft, honours every feature the
checkpoint uses, reads absent keys as speculators does, can serve its options, and which model runner serves it
(docs/reference/vllm.md §1-§3). Each needs a vLLM version (`needs="vllm"`).
"""

from __future__ import annotations

from collections.abc import Iterator

from speculator_operator.domain.algorithms import Algorithm, Family, in_family
from speculator_operator.domain.checkpoint.model import Checkpoint
from speculator_operator.domain.checkpoint.rules.base import AuditContext, Finding, Severity, rule
from speculator_operator.domain.releases import VLLM_ALGORITHMS, VLLM_FEATURES, supports


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
