"""The SpeculatorDeployment's spec: its inputs (inputs.py), how they are served (serving.py), what happens when an
input moves (upgradePolicy) and what the audit accepts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from speculator_operator.api.canary import Canary
from speculator_operator.api.common import Model
from speculator_operator.api.deployment.inputs import Speculator, Verifier
from speculator_operator.api.deployment.rules import ADAPTIVE_RULE, LEARNING_RULES
from speculator_operator.api.deployment.serving import Serving
from speculator_operator.api.learning import Learning
from speculator_operator.api.parallelism import layout_rules


class UpgradePolicy(Model):
    """What happens when an input moves under the same spec: the verifier's or the draft's revision, or a new draft
    revision to try as a canary."""

    on_verifier_change: Literal["Redeploy", "Retrain", "Pause"] = Field(
        default="Redeploy",
        description="Redeploy: re-audit and roll verifier and draft together; Retrain: train a new draft first; "
        "Pause: report VerifierCurrent=False and change nothing.",
    )
    on_draft_change: Literal["Redeploy", "Pause"] = Field(
        default="Redeploy",
        description="When the draft's bytes move under the same source (files replaced in place, a pointer moved "
        "to a new publish): Redeploy audits the new draft and rolls the pair out together; Pause reports "
        "DraftCurrent=False and changes nothing.",
    )
    poll_interval_seconds: int = Field(
        default=600, ge=30, le=86400, description="How often the verifier and draft revisions are resolved again."
    )
    canary: Canary | None = Field(
        default=None,
        description="Roll a new draft revision (the verifier unchanged) out as a canary judged on live acceptance "
        "against the incumbent; promoted or rolled back by the operator. Off when unset; `canary: {}` turns it on "
        "with the defaults (docs/concepts/canary.md).",
    )
    train_template: dict[str, Any] | None = Field(
        default=None,
        description="A SpeculatorTrainJob spec without verifier and deployTo: what Retrain runs (and Redeploy "
        "when the draft fails its audit against the new verifier). The operator adds the verifier pinned to the "
        "new revision and deployTo this deployment; the current pair keeps serving until the new draft passes.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class AuditPolicy(Model):
    """What the checkpoint audit accepts (docs/concepts/audit.md)."""

    allow_lossy: bool = Field(default=False, description="Accept lossy proposals (verifier_accept_k > 1, ...).")


class SpeculatorDeploymentSpec(Model):
    """The verifier, its draft, how they are served, and what happens when either moves."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.serving.adaptiveVerification) || !self.serving.adaptiveVerification "
        "|| !has(self.upgradePolicy.canary) "
        "|| self.upgradePolicy.canary.metric == 'MeanAcceptedLength'",
        "message": "with serving.adaptiveVerification vLLM verifies a varying share of each draft, so α is not "
        "measured: a canary compares MeanAcceptedLength (upgradePolicy.canary.metric)",
        "fieldPath": ".upgradePolicy.canary.metric",
    }, *LEARNING_RULES]})  # fmt: skip

    verifier: Verifier
    speculator: Speculator = Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.source) != has(self.fromTrainJob)",
                    "message": "set exactly one of speculator.source or speculator.fromTrainJob",
                }
            ]
        }
    )
    release: str | None = Field(default=None, max_length=64, description="Pinned release; default: the default one.")
    # `default: {}` lets the API server fill in the nested defaults when the block is left out
    serving: Serving = Field(
        default_factory=Serving,
        json_schema_extra={"default": {}, "x-kubernetes-validations": [*layout_rules("serving"), ADAPTIVE_RULE]},
    )
    upgrade_policy: UpgradePolicy = Field(
        default_factory=UpgradePolicy,
        description="What happens when the verifier or the draft moves under the same spec, and the canary.",
        json_schema_extra={"default": {}},
    )
    audit: AuditPolicy = Field(
        default_factory=AuditPolicy,
        description="What the checkpoint audit accepts (docs/concepts/audit.md).",
        json_schema_extra={"default": {}},
    )
    learning: Learning | None = Field(
        default=None,
        description="Capture served completions, retrain the draft on them when live acceptance drifts or enough "
        "new samples arrive, and let the canary decide (docs/concepts/learning.md). Off when unset: captured traffic "
        "is user data. Needs upgradePolicy.canary (a learned draft always goes through a canary), "
        "upgradePolicy.trainTemplate (what a learning run trains from), one node per replica (the capture runs in "
        "the serving pod's API server, a multi-node group's leader only) and no audit.allowLossy (only lossless "
        "decoding serves the verifier's own distribution). Accepted and validated; not acted on yet.",
    )
