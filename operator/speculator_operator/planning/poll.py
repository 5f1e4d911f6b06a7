"""What a SpeculatorDeployment's input poll (upgradePolicy.pollIntervalSeconds) comes to, from the revisions it
resolved: a new verifier redeploys the pair, retrains its draft, or pauses (onVerifierChange); a new draft
redeploys or pauses (onDraftChange). The pass resolves the verifier, asks `verifier_polled`, resolves the draft
only when that says so, asks `draft_polled`, and follows the plan (controllers/deployment.py). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.planning.inputs import InputAction, draft_change, verifier_change
from speculator_operator.planning.retrain import holds_for_retrain, retrain_due


@dataclass(frozen=True)
class Polled:
    """The plan of a poll, followed in this order: `status` set, `events` said, the whole reconcile when
    `reconcile`, then a retraining for the verifier revision `retrain` (after a reconcile, only when
    `retrain_if_degraded` and the reconcile's plan shows the draft failed its audit against it:
    `retrain_after_reconcile`). `draft`: the draft's revision is to be resolved next, and `draft_polled` asked."""

    status: SpeculatorDeploymentStatus | None = None
    events: tuple[tuple[str, str, str], ...] = ()
    reconcile: bool = False
    retrain: str | None = None
    retrain_if_degraded: bool = False
    draft: bool = False


def verifier_polled(
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    resolved: str | None,
    generation: int,
    *,
    now: datetime,
) -> Polled:
    """The verifier resolved to `resolved` (None: it has no revision to resolve)."""
    action, new_status = verifier_change(spec, status, resolved, generation, now=now)
    if action == InputAction.REDEPLOY:
        return Polled(reconcile=True, retrain=resolved, retrain_if_degraded=True)
    if action == InputAction.RETRAIN and resolved:
        return Polled(retrain=resolved if retrain_due(spec, action, status, resolved) else None)
    # the pair is pinned until the retrained draft is handed over: the draft is not polled meanwhile
    after = new_status if new_status is not None else status
    return Polled(status=new_status, draft=not holds_for_retrain(after, generation))


def draft_polled(
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    draft: str | None,
    generation: int,
    *,
    now: datetime,
) -> Polled:
    """The draft resolved to `draft` (None: it cannot be said), with `status` as the verifier's poll left it."""
    change = draft_change(spec, status, draft, generation, now=now)
    if change.action == InputAction.REDEPLOY:
        return Polled(events=tuple(change.events), reconcile=True)
    return Polled(status=change.status, events=tuple(change.events))


def retrain_after_reconcile(spec: SpeculatorDeploymentSpec, planned: SpeculatorDeploymentStatus, revision: str) -> bool:
    """After a redeploy for a new verifier: whether the reconcile's plan (`planned`) shows the draft failed its
    audit against it, and a train template makes it a retraining (planning/retrain.retrain_due)."""
    return retrain_due(spec, InputAction.REDEPLOY, planned, revision)
