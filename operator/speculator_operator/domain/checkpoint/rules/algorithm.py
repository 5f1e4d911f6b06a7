"""Rules on each algorithm's own parameters: K against block_size/ttt_steps/num_depths/num_speculative_steps,
the algorithm and K a deployment declares, the mask token, the dflash2/dspark/mtp constraints, and the
trainer's bfloat16 (the last of the draft's own rules, kept here so the findings keep their order).
"""

from __future__ import annotations

from collections.abc import Iterator

from speculator_operator.domain.algorithms import Algorithm, Family, in_family, needs_mask_token
from speculator_operator.domain.checkpoint.rules.base import AuditContext, Finding, Severity, _is_int, rule

FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


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
