"""The SpeculatorDeployment's CEL rules that stand apart from one field: the flags the operator renders itself
(extraArgs may not touch them; a SpeculatorTrainJob's servers refuse the same ones and more), the rule between
serving.adaptiveVerification and a cutoff schedule, and what spec.learning needs of the rest of the spec. A rule
about one field alone stays on that field."""

from __future__ import annotations

from typing import Any

from speculator_operator.api.parallelism import PARALLEL_FLAGS

# Flags the operator renders itself; extraArgs may not touch them (the CRD's CEL rule says the same).
OWNED_FLAGS = (
    "--model", "--served-model-name", "--speculative-config", "-sc", "--spec-method", "--spec-model",
    "--spec-tokens", "--tensor-parallel-size", "-tp", "--port", "--host", "--shutdown-timeout",
    "--max-num-seqs", "--quantization", "-q", "--revision", "--tokenizer", *PARALLEL_FLAGS,
)  # fmt: skip


def extra_args_schema(owned: tuple[str, ...]) -> dict[str, Any]:
    """The CRD schema of an extraArgs list: strings that touch none of `owned` (nor the removed
    disable_by_batch_size), checked by the API server (CEL)."""
    pattern = "^(" + "|".join(owned) + ")(=.*)?$"  # a hyphen needs no escape outside [...]
    return {
        "items": {"type": "string", "maxLength": 1024},
        "x-kubernetes-validations": [
            {
                "rule": f"self.all(a, !a.matches('{pattern}') && !a.contains('disable_by_batch_size'))",
                "message": "extraArgs may not set flags the operator renders (" + ", ".join(owned) + ") "
                "nor disable_by_batch_size (removed in vLLM 0.17; use cutoff)",
            }
        ],
    }


ADAPTIVE_RULE: dict[str, Any] = {
    "rule": "!has(self.adaptiveVerification) || !self.adaptiveVerification || !has(self.cutoff)",
    "message": "serving.adaptiveVerification trims verification per step: it and a serving.cutoff schedule cannot "
    "both decide K",
}


def _learning(condition: str) -> str:
    return f"!has(self.learning) || {condition}"


# spec.learning against the rest of the spec (each rule's why is in the learning field's description too)
LEARNING_RULES: list[dict[str, Any]] = [
    {
        "rule": _learning("has(self.upgradePolicy.canary)"),
        "message": "learning needs upgradePolicy.canary: a learned draft always earns its place through a canary "
        "before it serves every replica",
        "fieldPath": ".learning",
    },
    {
        "rule": _learning("has(self.upgradePolicy.trainTemplate)"),
        "message": "learning needs upgradePolicy.trainTemplate: a learning run is that SpeculatorTrainJob on the "
        "captured data",
        "fieldPath": ".learning",
    },
    {
        "rule": _learning("!has(self.serving.parallelism) || self.serving.parallelism.nodes == 1"),
        "message": "learning needs one node per replica (serving.parallelism.nodes 1): the capture runs in the "
        "serving pod's API server, which a multi-node group runs on its leader only",
        "fieldPath": ".learning",
    },
    {
        "rule": _learning("!has(self.audit.allowLossy) || !self.audit.allowLossy"),
        "message": "learning refuses audit.allowLossy: only lossless decoding serves the verifier's own "
        "distribution, the data a learning run trains on",
        "fieldPath": ".learning",
    },
    {
        "rule": _learning(
            "!has(self.serving.env) || "
            "!self.serving.env.exists(e, has(e.name) && e.name.startsWith('SPECULATOR_CAPTURE_'))"
        ),
        "message": "with learning, serving.env may not set SPECULATOR_CAPTURE_* variables: the operator sets them "
        "for the capture",
        "fieldPath": ".serving.env",
    },
    {
        "rule": _learning(
            "!has(self.learning.trigger) || !has(self.learning.trigger.drift) "
            "|| !has(self.serving.adaptiveVerification) || !self.serving.adaptiveVerification"
        ),
        "message": "learning.trigger.drift needs α, which serving.adaptiveVerification does not measure: trigger "
        "on minNewSamples alone",
        "fieldPath": ".learning.trigger.drift",
    },
]
