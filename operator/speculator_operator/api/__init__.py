"""Pydantic models of every CRD spec and status (the one schema source: crds/ is generated from here), the pod
contract between the pods and the operator (podcontract) and the label and annotation keys (labels)."""

from speculator_operator.api.common import API_VERSION, CATEGORY, GROUP, VERSION, Condition
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus

__all__ = [
    "API_VERSION", "CATEGORY", "GROUP", "VERSION", "Condition", "SpeculatorDeploymentSpec",
    "SpeculatorDeploymentStatus",
]  # fmt: skip
