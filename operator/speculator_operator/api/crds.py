"""The CustomResourceDefinitions, generated from the pydantic models (crds/ holds their YAML)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from speculator_operator.api.canary import IN_PLACE_RULE
from speculator_operator.api.common import CATEGORY, GROUP, VERSION
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import PART_OF_LABEL
from speculator_operator.api.schema import structural
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec, SpeculatorTrainJobStatus


def _crd(
    kind: str, plural: str, short: str, spec: type[BaseModel], status: type[BaseModel], doc: str,
    columns: list[dict[str, Any]], root_rules: list[dict[str, str]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {PART_OF_LABEL: "speculator-operator"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": doc,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": structural(spec),
                                # read before the operator's first pass, a new object says observedGeneration
                                # 0 (defaults apply as objects are read from storage), so kstatus reads it as
                                # InProgress rather than Current (docs/operations/gitops.md)
                                "status": {**structural(status), "default": {"observedGeneration": 0}},
                            },
                            **({"x-kubernetes-validations": root_rules} if root_rules else {}),
                        }
                    },
                }
            ],
        },
    }


def col(name: str, path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        column["priority"] = priority
    return column


def speculator_deployment_crd() -> dict[str, Any]:
    return _crd(
        "SpeculatorDeployment",
        "speculatordeployments",
        "sdep",
        SpeculatorDeploymentSpec,
        SpeculatorDeploymentStatus,
        "A verifier model and its speculative-decoding draft served together by vLLM, audited before any "
        "pod starts, rolled out together when the verifier moves.",
        [
            col("Phase", ".status.phase"),
            col("Verifier", ".spec.verifier.model"),
            col("Algorithm", ".status.algorithm"),
            col("K", ".status.numSpeculativeTokens", "integer"),
            col("vLLM", ".status.vllm"),
            col("Ready", ".status.readyReplicas", "integer"),
            col("Acceptance", ".status.acceptance.percent"),
            col("Effective", '.status.conditions[?(@.type=="SpeculationEffective")].status'),
            col("Age", ".metadata.creationTimestamp", "date"),
            col("Speedup", ".status.acceptance.predictedSpeedup", "number", priority=1),
            col("Best-K", ".status.acceptance.recommendedK", "integer", priority=1),
            col("Tuned", ".status.tuning.appliedAt", "date", priority=1),
            col("Revision", ".status.revision", priority=1),
            col("Verifier-Rev", ".status.verifierRevision", priority=1),
            col("Draft-Rev", ".status.draftRevision", priority=1),
            col("Canary", ".status.canary.state", priority=1),
        ],
        root_rules=[
            {
                "rule": "self.metadata.name != 'vllm'",
                "message": "a SpeculatorDeployment may not be named vllm: its Service would inject VLLM_PORT into "
                "pods and stop vLLM at start-up",
            },
            IN_PLACE_RULE,
        ],
    )


def speculator_train_job_crd() -> dict[str, Any]:
    return _crd(
        "SpeculatorTrainJob",
        "speculatortrainjobs",
        "stj",
        SpeculatorTrainJobSpec,
        SpeculatorTrainJobStatus,
        "Trains a speculative-decoding draft for a verifier: data, hidden-state extraction with vLLM, "
        "torchrun training with the pinned speculators, audit, and an atomic publish; optionally hands the "
        "result to a SpeculatorDeployment.",
        [
            col("Phase", ".status.phase"),
            col("Verifier", ".spec.verifier.model"),
            col("Algorithm", ".spec.algorithm"),
            col("Stage", ".status.stage"),
            col("Epoch", ".status.progress.epoch", "integer"),
            col("Step", ".status.progress.step", "integer"),
            col("Checkpoint", ".status.checkpoint.uri"),
            col("Age", ".metadata.creationTimestamp", "date"),
            col("Digest", ".status.checkpoint.digest", priority=1),
            col("Verifier-Rev", ".status.provenance.verifierRevision", priority=1),
            col("Loss", ".status.progress.loss", "number", priority=1),
            col("ETA-Seconds", ".status.progress.etaSeconds", "integer", priority=1),
            col("Acceptance", ".status.evaluation.rate", "number", priority=1),
        ],
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in crds/ -> CRD."""
    return {
        f"{GROUP}_speculatordeployments.yaml": speculator_deployment_crd(),
        f"{GROUP}_speculatortrainjobs.yaml": speculator_train_job_crd(),
    }
