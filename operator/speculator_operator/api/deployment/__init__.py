"""SpeculatorDeployment: a verifier + draft pair served by vLLM, audited before any pod exists.

One module per part of the kind: inputs (the verifier and the draft), serving (how vLLM serves them), rules (the CEL
rules that stand apart from one field), spec (the spec that holds them) and status. The CRD is generated from
SpeculatorDeploymentSpec and SpeculatorDeploymentStatus (api/crds.py)."""

from speculator_operator.api.deployment.inputs import DeclaredAlgorithm, Speculator, Verifier
from speculator_operator.api.deployment.rules import ADAPTIVE_RULE, OWNED_FLAGS, extra_args_schema
from speculator_operator.api.deployment.serving import Cutoff, Serving, Tuning
from speculator_operator.api.deployment.spec import AuditPolicy, SpeculatorDeploymentSpec, UpgradePolicy
from speculator_operator.api.deployment.status import (
    Acceptance,
    AcceptanceLoad,
    AcceptancePods,
    AuditSummary,
    HandedOver,
    LoadEconomics,
    PairEconomics,
    RenderNote,
    Requests,
    RetrainStatus,
    ServedImage,
    ServingState,
    SpeculatorDeploymentStatus,
    SweepRef,
    TuningPending,
    TuningStatus,
)

__all__ = [
    "ADAPTIVE_RULE",
    "OWNED_FLAGS",
    "Acceptance",
    "AcceptanceLoad",
    "AcceptancePods",
    "AuditPolicy",
    "AuditSummary",
    "Cutoff",
    "DeclaredAlgorithm",
    "HandedOver",
    "LoadEconomics",
    "PairEconomics",
    "RenderNote",
    "Requests",
    "RetrainStatus",
    "ServedImage",
    "Serving",
    "ServingState",
    "Speculator",
    "SpeculatorDeploymentSpec",
    "SpeculatorDeploymentStatus",
    "SweepRef",
    "Tuning",
    "TuningPending",
    "TuningStatus",
    "UpgradePolicy",
    "Verifier",
    "extra_args_schema",
]
