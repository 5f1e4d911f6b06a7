"""The kstatus conditions of both kinds, derived from the rest of the status just before a pass writes it. Pure.

GitOps tools judge a custom resource by its conditions, not by our `phase` (docs/operations/gitops.md):
Flux and Helm 4's `--wait` run kstatus (fluxcd/cli-utils `status.Compute`), which reads, in order,
`metadata.generation` against `status.observedGeneration` (InProgress while they differ), then
`Reconciling=True` (InProgress) and `Stalled=True` (Failed), and last `Ready` (True: Current, else InProgress).
Without `Stalled`, a deployment whose audit failed for good is InProgress forever: `helm install --wait` waits out
its timeout and reports a timeout instead of the finding.

So every pass ends with exactly one of:
- `Stalled=True`: nothing progresses without a change of spec or of an input; the reason and the first finding;
- `Reconciling=True`: the operator is working towards the spec; the reason and what it is doing;
- neither (both removed): settled, or waiting on something that is not the operator's work to finish (a train
  job's running stage, as kstatus treats a started Job; a retraining while the last good pair serves).

They are derived here, in one place, from what the planners decided (the phase and the other conditions' reasons),
so no planner can forget them and they cannot contradict `Ready`. They change only when the rest of the status
changes, so they cost no write of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypeVar

from speculator_operator.api.common import conditions_of, evolve, make_condition, stored
from speculator_operator.api.deployment import SpeculatorDeploymentStatus
from speculator_operator.api.podcontract import ServerExitReason
from speculator_operator.api.trainjob import SpeculatorTrainJobStatus
from speculator_operator.planning.inputs import AuditedReason, ServingReason, VerifierReason
from speculator_operator.planning.pods import ImageReason


class Health(StrEnum):
    """The kstatus condition types (the kstatus CRD status convention)."""

    RECONCILING = "Reconciling"
    STALLED = "Stalled"


# A rollout's pod that cannot get its image, a server that finds no accelerator or refuses its staged draft, or a
# Deployment past its progressDeadlineSeconds: the kubelet and the Deployment controller go on retrying, but nothing
# changes until the image, the spec or the node does. (A server whose engine exited otherwise is retried: its cause
# can pass.)
STALLED_ROLLOUT = frozenset({
    ServingReason.PROGRESS_DEADLINE_EXCEEDED, *ImageReason, ServerExitReason.NO_ACCELERATOR,
    ServerExitReason.DRAFT_AUDIT_FAILED,
})  # fmt: skip
# The inputs of a SpeculatorDeployment that are wrong for good (the Audited condition's reasons): a train job that
# failed, or trains for another verifier. An unreadable checkpoint or a train job still running is retried.
STALLED_INPUTS = frozenset({AuditedReason.FAILED, AuditedReason.TRAINJOB_FAILED, AuditedReason.TRAINJOB_MISMATCH})
# A layout nothing here can serve until the spec or the cluster changes: the release refuses it, or the cluster has no
# LeaderWorkerSet API (also while an earlier single-node pair keeps serving).
STALLED_LAYOUT = frozenset({ServingReason.LWS_UNAVAILABLE, ServingReason.LAYOUT_UNSUPPORTED})


@dataclass(frozen=True)
class Verdict:
    kind: Health
    reason: str
    message: str


def deployment_verdict(status: SpeculatorDeploymentStatus) -> Verdict | None:
    """Stalled, Reconciling or neither for a SpeculatorDeployment's status."""
    conds = conditions_of(status)
    ready, audited = conds.get("Ready"), conds.get("Audited")
    verifier, serving = conds.get("VerifierCurrent"), conds.get("Serving")
    phase = status.phase
    if ready is not None and ready.status != "True" and ready.reason in STALLED_LAYOUT:
        return Verdict(Health.STALLED, ready.reason, ready.message)
    if phase == "Failed" and ready is not None:  # InvalidSpec, ReleaseUnsupported, AuditFailed, TrainJob*
        reason = audited.reason if audited is not None and audited.reason in STALLED_INPUTS else ready.reason
        return Verdict(Health.STALLED, reason, ready.message)
    if verifier is not None and verifier.reason == VerifierReason.RETRAIN_UNAVAILABLE:
        return Verdict(Health.STALLED, verifier.reason, verifier.message)
    retraining = status.retrain is not None
    if audited is not None and audited.status != "True" and audited.reason in STALLED_INPUTS:
        if retraining and verifier is not None:
            # the new verifier refused the draft and a draft for it is being trained: Ready stays False (the
            # last good pair serves, not the one asked for), so kstatus says InProgress either way; say why
            return Verdict(Health.RECONCILING, verifier.reason, verifier.message)
        return Verdict(Health.STALLED, audited.reason, ready.message if ready is not None else audited.message)
    if phase == "Deploying" and serving is not None and serving.status == "False" and serving.reason in STALLED_ROLLOUT:
        return Verdict(Health.STALLED, serving.reason, serving.message)
    if phase in ("Pending", "Auditing") or (phase == "Degraded" and audited is not None and audited.status != "True"):
        # an input not readable yet (retried), a train job still running, an audit under way
        source = audited if audited is not None and audited.status != "True" else ready
        if source is not None:
            return Verdict(Health.RECONCILING, source.reason, source.message)
        return Verdict(Health.RECONCILING, "Pending", "waiting for the first pass")
    applying = ready is not None and ready.reason == ServingReason.APPLY_FAILED
    if phase == "Deploying" or applying:
        source = ready if applying else serving or ready
        if source is not None:
            return Verdict(Health.RECONCILING, source.reason, source.message)
    canary = status.canary
    if canary is not None and canary.state in ("Analyzing", "Promoting"):
        # the operator is still deciding (or rolling the winner out): a GitOps sync waits for the verdict
        reason = "CanaryAnalyzing" if canary.state == "Analyzing" else "CanaryPromoting"
        return Verdict(Health.RECONCILING, reason, canary.message or f"canary of {canary.candidate.revision}")
    return None


def trainjob_verdict(status: SpeculatorTrainJobStatus) -> Verdict | None:
    """Stalled, Reconciling or neither for a SpeculatorTrainJob's status. A run is Reconciling until its first
    stage's Job has started, and then, as kstatus treats a started Job, neither until it ends: a training that
    runs for hours must not hold `helm install --wait` or a Flux health check for hours."""
    conds = conditions_of(status)
    failed, ready = conds.get("Failed"), conds.get("Ready")
    if status.phase == "Failed" and failed is not None:
        return Verdict(Health.STALLED, failed.reason, failed.message)
    if status.phase == "Succeeded":
        return None
    if failed is not None and failed.status == "False" and failed.reason in STALLED_ROLLOUT | STALLED_LAYOUT:
        return Verdict(Health.STALLED, failed.reason, failed.message)  # a stage's pod cannot get its image
    started = any(s.start_time for s in status.stages)
    if status.phase in (None, "Pending") or not started:
        source = ready if ready is not None and ready.status != "True" else failed
        if source is not None:
            return Verdict(Health.RECONCILING, source.reason, source.message)
        return Verdict(Health.RECONCILING, "Pending", "waiting for the first stage to start")
    return None


S = TypeVar("S", SpeculatorDeploymentStatus, SpeculatorTrainJobStatus)


def with_verdict(status: S, verdict: Verdict | None, now: datetime) -> S:
    """`status` with Reconciling/Stalled set from `verdict`: the one True, the other removed; both removed when
    there is none. The conditions' observedGeneration is the status's; the same status keeps its transition time
    (a new one is `now`, the pass's time)."""
    drop = {h.value for h in Health if verdict is None or h != verdict.kind}
    out = evolve(status, None, conditions=[c for c in status.conditions if c.type not in drop])
    if verdict is not None:
        generation = status.observed_generation or 0
        out = evolve(
            out, None, make_condition(generation, verdict.kind, True, verdict.reason, verdict.message), now=now
        )
    return status if stored(out) == stored(status) else out


def deployment_health(status: SpeculatorDeploymentStatus, now: datetime) -> SpeculatorDeploymentStatus:
    return with_verdict(status, deployment_verdict(status), now)


def trainjob_health(status: SpeculatorTrainJobStatus, now: datetime) -> SpeculatorTrainJobStatus:
    return with_verdict(status, trainjob_verdict(status), now)
