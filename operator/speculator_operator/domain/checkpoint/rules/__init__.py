"""Audit rules: one small registered function each, with an id and a severity.

A rule gets the AuditContext and yields messages (which take the rule's severity) or Findings (to
choose another severity). Messages name the values seen. The facts behind the rules are in
docs/reference/speculators.md §2-§3 and docs/reference/vllm.md §1-§3.

The machinery (Finding, AuditContext, the RULES registry, run_rules) is base.py's; the rules come in families,
one module each, by what they read: the draft's config.json (config.py), its tensors' headers (tensors.py), the
algorithm's own parameters (algorithm.py), the verifier being served (verifier.py), the pinned vLLM (vllm.py)
and the tensor data under --deep (deep.py).
"""

# Each family registers its rules as it is imported and RULES keeps that order, which is the order of the
# findings a report lists: the imports below are in that order, not the alphabet's.
# isort: off
from speculator_operator.domain.checkpoint.rules.base import (
    KNOWN_TYPES,
    RULES,
    AuditContext,
    Finding,
    Rule,
    RuleFn,
    Severity,
    rule,
    run_rules,
)
from speculator_operator.domain.checkpoint.rules.config import (
    EAGLE_DECODERS,
    aux_layer_ids,
    config_structure,
    decoder_family,
    hidden_size,
    lossless,
    model_type,
    proposal,
)
from speculator_operator.domain.checkpoint.rules.tensors import (
    embed_tokens,
    embed_tokens_shared,
    fc_shape,
    layer0_attention,
    layer_count,
    lm_head,
    vocab_maps,
)
from speculator_operator.domain.checkpoint.rules.algorithm import (
    FLOAT_DTYPES,
    algorithm_specific,
    declared_draft,
    dtype,
    mask_token,
    speculative_tokens,
)
from speculator_operator.domain.checkpoint.rules.verifier import (
    MTP_VERIFIER_TYPES,
    provenance,
    verifier_architecture,
    verifier_hidden_size,
    verifier_layers,
    verifier_name,
    verifier_revision,
    verifier_vocab,
)
from speculator_operator.domain.checkpoint.rules.vllm import (
    vllm_defaults,
    vllm_features,
    vllm_loadable,
    vllm_runner,
    vllm_servable,
)
from speculator_operator.domain.checkpoint.rules.deep import SAMPLE_BYTES, deep_loaded, deep_vocab_map

# isort: on

__all__ = [
    "EAGLE_DECODERS",
    "FLOAT_DTYPES",
    "KNOWN_TYPES",
    "MTP_VERIFIER_TYPES",
    "RULES",
    "SAMPLE_BYTES",
    "AuditContext",
    "Finding",
    "Rule",
    "RuleFn",
    "Severity",
    "algorithm_specific",
    "aux_layer_ids",
    "config_structure",
    "declared_draft",
    "decoder_family",
    "deep_loaded",
    "deep_vocab_map",
    "dtype",
    "embed_tokens",
    "embed_tokens_shared",
    "fc_shape",
    "hidden_size",
    "layer0_attention",
    "layer_count",
    "lm_head",
    "lossless",
    "mask_token",
    "model_type",
    "proposal",
    "provenance",
    "rule",
    "run_rules",
    "speculative_tokens",
    "verifier_architecture",
    "verifier_hidden_size",
    "verifier_layers",
    "verifier_name",
    "verifier_revision",
    "verifier_vocab",
    "vllm_defaults",
    "vllm_features",
    "vllm_loadable",
    "vllm_runner",
    "vllm_servable",
    "vocab_maps",
]
