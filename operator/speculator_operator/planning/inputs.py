"""A SpeculatorDeployment's inputs that move under the same spec (upgradePolicy): what a newly resolved verifier
or draft revision asks for, as an action (an enum) and the status to write. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from speculator_operator.api.common import conditions_of, evolve, make_condition, stored
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus


class InputAction(StrEnum):
    """What a newly resolved verifier or draft revision asks for (upgradePolicy)."""

    NONE = "none"
    REDEPLOY = "redeploy"
    RETRAIN = "retrain"
    PAUSE = "pause"


class VerifierReason(StrEnum):
    """The VerifierCurrent condition's reasons (decisions read them only as these)."""

    RESOLVED = "RevisionResolved"
    CHANGED = "VerifierChanged"
    RETRAINING = "Retraining"
    RETRAIN_UNAVAILABLE = "RetrainUnavailable"


class AuditedReason(StrEnum):
    """Reasons of a SpeculatorDeployment's Audited condition that decisions read (planning/health.py)."""

    PASSED = "AuditPassed"
    FAILED = "AuditFailed"
    TRAINJOB_PENDING = "TrainJobPending"
    TRAINJOB_FAILED = "TrainJobFailed"
    TRAINJOB_MISMATCH = "TrainJobMismatch"


class ServingReason(StrEnum):
    """Reasons of the Serving and Ready conditions that decisions read (planning/health.py)."""

    APPLY_FAILED = "ApplyFailed"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"  # the child Deployment's own reason
    LWS_UNAVAILABLE = "LeaderWorkerSetUnavailable"  # a multi-node layout where the cluster serves no LeaderWorkerSet
    LAYOUT_UNSUPPORTED = "LayoutUnsupported"  # a parallel layout the release cannot serve with this draft


def verifier_change(
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    resolved: str | None,
    generation: int,
    *,
    now: datetime,
) -> tuple[InputAction, SpeculatorDeploymentStatus | None]:
    """What a newly resolved verifier revision means: (the action, the status to write if any).

    Redeploy re-audits the draft against the new verifier and rolls both out together (or keeps the
    last good pair serving if the audit fails); Pause and Retrain only report VerifierCurrent=False.
    """
    old = status.verifier_revision
    if resolved is None or old is None or resolved == old:
        return InputAction.NONE, None
    policy = spec.upgrade_policy.on_verifier_change
    if policy == "Redeploy":
        return InputAction.REDEPLOY, None
    if policy == "Pause":
        reason, message = (
            VerifierReason.CHANGED,
            f"the verifier moved from {old} to {resolved}; upgradePolicy is Pause: nothing is rolled out",
        )
        return InputAction.PAUSE, evolve(
            status, generation, make_condition(generation, "VerifierCurrent", False, reason, message), now=now
        )
    return InputAction.RETRAIN, None


@dataclass
class DraftChange:
    """What a newly resolved draft revision means under upgradePolicy.onDraftChange."""

    action: InputAction
    status: SpeculatorDeploymentStatus | None = None  # the status to write (pause)
    events: list[tuple[str, str, str]] = field(default_factory=list)


def draft_change(
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    resolved: str | None,
    generation: int,
    *,
    now: datetime,
) -> DraftChange:
    """The draft's bytes moved under the same source (a file replaced in place, a pointer moved to a new
    publish). Redeploy: audit the new draft and roll the pair out together. Pause: DraftCurrent=False and
    nothing moves; a replica of the old revision that restarts then finds its audited bytes gone (unless
    the old location is immutable) and refuses to start rather than serve what was not audited.
    Retrain means nothing here: a new draft needs no new training."""
    old = status.draft_revision
    if resolved is None or old is None or resolved == old:
        return DraftChange(InputAction.NONE)
    if (
        status.canary is not None
        and status.canary.verdict != "Promoted"
        and resolved == status.canary.candidate.draft_revision
    ):
        return DraftChange(InputAction.NONE)  # in a canary, or rejected by one: not new
    source = spec.speculator.source or status.draft_source
    message = f"the draft at {source} moved from {old} to {resolved}"
    verifier = conditions_of(status).get("VerifierCurrent")
    # a roll-out would move the verifier too
    verifier_paused = verifier is not None and verifier.reason == VerifierReason.CHANGED
    if spec.upgrade_policy.on_draft_change == "Redeploy" and not verifier_paused:
        return DraftChange(
            InputAction.REDEPLOY, None, [("Normal", "DraftChanged", f"{message}; auditing it to roll it out")]
        )
    why = "the verifier change is paused too" if verifier_paused else "onDraftChange is Pause"
    message += (
        f"; {why}: nothing is rolled out, and replicas that restart cannot stage the audited bytes unless they "
        "are still where they were"
    )
    paused = evolve(
        status, generation, make_condition(generation, "DraftCurrent", False, "DraftChanged", message), now=now
    )
    events = [] if stored(paused) == stored(status) else [("Warning", "DraftChanged", message)]
    return DraftChange(InputAction.PAUSE, paused, events)
