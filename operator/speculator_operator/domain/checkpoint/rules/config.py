"""Rules on the draft's config.json: a speculators type, the keys vLLM needs, a sane and lossless proposal,
the decoder family, the hidden size and the aux hidden-state layer ids (docs/reference/speculators.md §2-§3).

They read the config alone; the tensors' shapes that follow from it are rules/tensors.py's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from speculator_operator.domain.algorithms import Algorithm, Family
from speculator_operator.domain.checkpoint.rules.base import (
    KNOWN_TYPES,
    AuditContext,
    Finding,
    Severity,
    _is_int,
    _known,
    rule,
)

EAGLE_DECODERS = ("llama", "qwen3")


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
