"""The canary of a new draft revision (docs/concepts/canary.md): when one starts, what each analysis interval says,
when the evidence promotes or rolls back, and the children a running canary asks for. Pure.

The rule, per interval (both sides measured on the same interval by the scraper):
- either side verified fewer than `minDrafts` drafts: **Inconclusive** (no traffic is no evidence: it neither
  passes nor fails, and it resets no run);
- the candidate's figure (α, or the mean accepted length) below the incumbent's by more than `margin`: **Fail**;
- otherwise **Pass**.
`promoteAfter` passes in a row promote; `rollbackAfter` failures in a row, or `maxFailures` in all, roll back. A
verdict ends the analysis: alternating evidence yields at most one verdict. An interval is counted once: one that
starts before `analyzedUntil` (already counted, or measured before an operator restart) is ignored.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from speculator_operator.api.canary import Canary, CanaryCounts, CanarySide, CanaryStatus, IntervalVerdict
from speculator_operator.api.common import Condition, evolve, make_condition, stamp
from speculator_operator.api.deployment import Acceptance, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import REVISION_LABEL, TRACK_LABEL
from speculator_operator.telemetry.canary import Measured

CANARY_SUFFIX = "-canary"
CANARY_TRACK = "canary"


class Move(StrEnum):
    """What the pass does with a freshly rendered revision."""

    NONE = "None"  # roll it out as ever (no canary policy, a verifier change, nothing new)
    START = "Start"  # a new draft revision: start (or start over) a canary
    KEEP = "Keep"  # the canary in flight goes on
    HOLD = "Hold"  # the rendered draft was rejected: the incumbent keeps serving
    PROMOTE = "Promote"  # the candidate won: it rolls to every replica


@dataclass(frozen=True)
class Rendered:
    """What the pass knows of the revision it has just rendered and of the incumbent."""

    revision: str
    draft_revision: str | None
    verifier_revision: str | None
    serving_revision: str | None  # the revision the incumbent workload carries now (its annotation), None: none


def decide(spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus, new: Rendered, generation: int) -> Move:
    policy = spec.upgrade_policy.canary
    canary = status.canary
    if (
        canary is not None
        and canary.state == "RolledBack"
        and canary.candidate.draft_revision == new.draft_revision
        and canary.generation == generation
        and new.revision != status.revision
        and new.verifier_revision == status.verifier_revision
    ):
        return Move.HOLD  # the same bytes under the same spec and verifier: not tried again
    if policy is None or spec.serving.layout.multi_node:
        return Move.NONE
    if canary is not None and canary.candidate.revision == new.revision and canary.generation == generation:
        if canary.state == "Analyzing":
            return Move.KEEP
        if canary.state == "Promoting":
            return Move.PROMOTE
    incumbent = status.revision
    if (
        incumbent is None
        or new.revision == incumbent
        or new.serving_revision != incumbent
        or not (status.ready_replicas or 0)
        or status.draft_revision is None
        or new.draft_revision == status.draft_revision
        or new.verifier_revision != status.verifier_revision
    ):
        return Move.NONE  # nothing serves to compare against, or not a new draft alone
    return Move.START


def running(status: SpeculatorDeploymentStatus) -> bool:
    """Whether a canary is in flight (analysed, or being promoted)."""
    return status.canary is not None and status.canary.state in ("Analyzing", "Promoting")


def start(
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    new: Rendered,
    candidate_draft_source: str | None,
    generation: int,
    now: datetime,
) -> CanaryStatus:
    policy = spec.upgrade_policy.canary
    assert policy is not None
    replicas = spec.serving.replicas
    return CanaryStatus(
        state="Analyzing",
        candidate=CanarySide(
            revision=new.revision, draft_revision=new.draft_revision, replicas=policy.canary_replicas(replicas)
        ),
        incumbent=CanarySide(
            revision=status.revision or "",
            draft_revision=status.draft_revision,
            replicas=policy.incumbent_replicas(replicas),
        ),
        k=status.num_speculative_tokens,
        mode=policy.mode,
        started_at=stamp(now),
        generation=generation,
        analyzed_until=stamp(now),
        message=f"draft {new.draft_revision} ({candidate_draft_source or 'same source'}) on "
        f"{policy.canary_replicas(replicas)} replica(s) beside {status.draft_revision}",
    )


def figure(policy: Canary, acc: Acceptance) -> float | None:
    return acc.alpha if policy.metric == "Alpha" else acc.mean_accepted_length


def interval_verdict(policy: Canary, m: Measured) -> IntervalVerdict:
    cand, inc = m.candidate, m.incumbent
    if (cand.drafts or 0) < policy.min_drafts or (inc.drafts or 0) < policy.min_drafts:
        return "Inconclusive"
    a, b = figure(policy, cand), figure(policy, inc)
    if a is None or b is None:
        return "Inconclusive"
    return "Fail" if a < b - policy.margin - 1e-9 else "Pass"


def _side(side: CanarySide, acc: Acceptance) -> CanarySide:
    return evolve(
        side,
        None,
        drafts=acc.drafts,
        rate=acc.rate,
        alpha=acc.alpha,
        mean_accepted_length=acc.mean_accepted_length,
        predicted_speedup=acc.predicted_speedup,
    )


def describe(policy: Canary, canary: CanaryStatus) -> str:
    """Both sides' figures, for the verdict's words."""
    name = "α" if policy.metric == "Alpha" else "mean accepted length"
    c, i = canary.candidate, canary.incumbent
    fc, fi = (c.alpha, i.alpha) if policy.metric == "Alpha" else (c.mean_accepted_length, i.mean_accepted_length)
    n = canary.counts
    return (
        f"candidate {c.revision} {name} {fc} (rate {c.rate}, {c.drafts} drafts) vs incumbent {i.revision} {name} "
        f"{fi} (rate {i.rate}, {i.drafts} drafts), margin {policy.margin:g}; intervals passed {n.passed}, failed "
        f"{n.failed}, inconclusive {n.inconclusive}"
    )


def fold(
    canary: CanaryStatus, m: Measured, policy: Canary, now: datetime
) -> tuple[CanaryStatus, IntervalVerdict | None]:
    """The canary after one measured interval, and that interval's verdict (None: not counted: the analysis is
    over, or the interval was counted before)."""
    if canary.state != "Analyzing" or (canary.analyzed_until is not None and m.start < canary.analyzed_until):
        return canary, None
    verdict = interval_verdict(policy, m)
    n = canary.counts
    if verdict == "Pass":
        counts = CanaryCounts(passed=n.passed + 1, failed=n.failed, inconclusive=n.inconclusive,
                              passed_in_a_row=n.passed_in_a_row + 1, failed_in_a_row=0)  # fmt: skip
    elif verdict == "Fail":
        counts = CanaryCounts(passed=n.passed, failed=n.failed + 1, inconclusive=n.inconclusive,
                              passed_in_a_row=0, failed_in_a_row=n.failed_in_a_row + 1)  # fmt: skip
    else:
        counts = evolve(n, None, inconclusive=n.inconclusive + 1)
    out = evolve(
        canary,
        None,
        candidate=_side(canary.candidate, m.candidate),
        incumbent=_side(canary.incumbent, m.incumbent),
        counts=counts,
        last_interval=verdict,
        analyzed_until=m.end,
    )
    if counts.failed_in_a_row >= policy.rollback_after or counts.failed >= policy.max_failures:
        out = evolve(out, None, state="RolledBack", verdict="RolledBack", verdict_at=stamp(now))
    elif counts.passed_in_a_row >= policy.promote_after:
        out = evolve(out, None, state="Promoting", verdict="Promoted", verdict_at=stamp(now))
    return evolve(out, None, message=describe(policy, out)), verdict


def canary_name(name: str) -> str:
    return f"{name}{CANARY_SUFFIX}"


def canary_workload(rendered: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The candidate's Deployment from the rendered one: its own name and `replicas`, and a track label on its
    selector and pods, so that neither Deployment's ReplicaSets adopt the other's pods (the Service and the PDB
    select the common labels: both tracks)."""
    out = copy.deepcopy(rendered)
    out["metadata"]["name"] = canary_name(rendered["metadata"]["name"])
    out["metadata"]["labels"] = {**out["metadata"]["labels"], TRACK_LABEL: CANARY_TRACK}
    spec = out["spec"]
    spec["replicas"] = replicas
    spec["selector"] = {"matchLabels": {**spec["selector"]["matchLabels"], TRACK_LABEL: CANARY_TRACK}}
    template = spec["template"]["metadata"]
    template["labels"] = {**template["labels"], TRACK_LABEL: CANARY_TRACK}
    return out


_SERVER_SET = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")


def scaled(live: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The incumbent Deployment as it runs, at `replicas`: what an InPlace canary applies (its template is taken
    from the live object, unchanged, so nothing rolls: the incumbent's bytes may be gone from their source, and
    it is never rendered again)."""
    meta = live.get("metadata") or {}
    kept = {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "ownerReferences")}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k == REVISION_LABEL}
    spec = copy.deepcopy(live.get("spec") or {})
    spec["replicas"] = replicas
    out: dict[str, Any] = _drop_none(
        {
            "apiVersion": live.get("apiVersion") or "apps/v1",
            "kind": live.get("kind") or "Deployment",
            "metadata": {**kept, "annotations": annotations},
            "spec": spec,
        }
    )
    return out


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None and k not in _SERVER_SET}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def applied_revision(child: dict[str, Any] | None) -> str | None:
    """The revision a workload carries (its annotation), None without one."""
    if child is None:
        return None
    return ((child.get("metadata") or {}).get("annotations") or {}).get(REVISION_LABEL)


@dataclass
class Shaped:
    """What a canary makes of a pass's plan: the children to apply and to delete, the canary's status, whether the
    status keeps the incumbent's revision, the incumbent's replicas, and the events."""

    children: list[dict[str, Any]]
    prune: list[tuple[str, str, str]]
    canary: CanaryStatus | None
    held: bool = False
    incumbent_replicas: int | None = None
    events: list[tuple[str, str, str]] | None = None


def _workload(children: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((c for c in children if c["kind"] == "Deployment"), None)


def shape(
    move: Move,
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    children: list[dict[str, Any]],
    new: Rendered,
    live: dict[str, Any] | None,
    draft_source: str | None,
    generation: int,
    now: datetime,
) -> Shaped:
    """The plan's children and canary status for `move`. The incumbent workload is never rendered again while a
    canary runs or after it rejected a draft: Surge leaves it alone, InPlace scales the live object."""
    canary, replicas = status.canary, spec.serving.replicas
    workload = _workload(children)
    others = [c for c in children if c is not workload]
    name = str((workload or {}).get("metadata", {}).get("name") or "")
    delete = [("apps/v1", "Deployment", canary_name(name))] if workload is not None else []
    if move in (Move.START, Move.KEEP) and workload is not None:
        policy = spec.upgrade_policy.canary
        assert policy is not None
        out = [*others, canary_workload(workload, policy.canary_replicas(replicas))]
        keep = policy.incumbent_replicas(replicas)
        if policy.mode == "InPlace" and live is not None:
            out.append(scaled(live, keep))
        if move == Move.KEEP and canary is not None:
            return Shaped(out, [], canary, held=True, incumbent_replicas=keep)
        started = start(spec, status, new, draft_source, generation, now)
        words = f"canary of revision {new.revision} (draft {new.draft_revision}) beside {status.revision}"
        events = [("Normal", "CanaryStarted", words)]
        if running(status) and canary is not None:
            events.insert(0, ("Normal", "CanaryEnded", f"canary of {canary.candidate.revision} ended: {words}"))
        return Shaped(out, [], started, held=True, incumbent_replicas=keep, events=events)
    if move == Move.HOLD and canary is not None:
        out = list(others)
        if live is not None and canary.mode == "InPlace":
            out.append(scaled(live, replicas))  # back to every replica, its template as it runs
        return Shaped(out, delete, canary, held=True)
    if move == Move.PROMOTE:
        return Shaped(children, [], canary)  # the canary goes once the promoted revision is ready (promoted())
    if running(status) and canary is not None:  # ended: a verifier change, the policy removed, the draft reverted
        ended = ("Normal", "CanaryEnded", f"canary of {canary.candidate.revision} ended: revision {new.revision} "
                 "rolls out without one")  # fmt: skip
        return Shaped(children, delete, None, events=[ended])
    return Shaped(children, [], canary)


def promoted(
    status: SpeculatorDeploymentStatus, name: str, now: datetime
) -> tuple[CanaryStatus, tuple[str, str, str]] | None:
    """A promoted candidate serves on every replica: the canary's final status and its Deployment to delete (None:
    not yet, or no canary being promoted)."""
    canary = status.canary
    if canary is None or canary.state != "Promoting" or status.phase != "Ready":
        return None
    if status.revision != canary.candidate.revision:
        return None
    return evolve(canary, None, state="Promoted", verdict_at=canary.verdict_at or stamp(now)), (
        "apps/v1",
        "Deployment",
        canary_name(name),
    )


def serving_replicas(spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus) -> int:
    """The replicas the incumbent workload should have now: fewer while an InPlace canary is analysed."""
    canary, policy = status.canary, spec.upgrade_policy.canary
    if canary is not None and canary.state == "Analyzing" and canary.mode == "InPlace" and policy is not None:
        return policy.incumbent_replicas(spec.serving.replicas)
    return spec.serving.replicas


def with_replicas(spec: SpeculatorDeploymentSpec, replicas: int) -> SpeculatorDeploymentSpec:
    return spec.model_copy(update={"serving": spec.serving.model_copy(update={"replicas": replicas})})


def draft_condition(generation: int, canary: CanaryStatus | None, resolved: Condition) -> Condition:
    """DraftCurrent while the incumbent holds: False, CanaryAnalyzing (or CanaryRejected, with both figures)."""
    if canary is None:
        return resolved
    if canary.state == "RolledBack":
        said = f"draft {canary.candidate.draft_revision} rejected by its canary: {canary.message}"
        return make_condition(generation, "DraftCurrent", False, "CanaryRejected", said)
    said = f"draft {canary.candidate.draft_revision} in a canary beside {canary.incumbent.draft_revision}"
    return make_condition(generation, "DraftCurrent", False, "CanaryAnalyzing", said)


def judge_intervals(
    spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus, measured: tuple[Measured, ...], now: datetime
) -> tuple[SpeculatorDeploymentStatus | None, list[tuple[str, str, str]], str | None]:
    """The status after a scrape's measured intervals are folded in (None: nothing counted), the events, and the
    verdict reached, if one was (the pass then reconciles: it promotes or rolls back)."""
    canary, policy = status.canary, spec.upgrade_policy.canary
    if canary is None or policy is None or canary.state != "Analyzing":
        return None, [], None
    folded = canary
    for m in measured:
        folded, _ = fold(folded, m, policy, now)
    if folded == canary:
        return None, [], None
    events: list[tuple[str, str, str]] = []
    if folded.verdict == "Promoted":
        events.append(("Normal", "CanaryPromoted", f"revision {folded.candidate.revision} rolls to every replica: "
                       f"{folded.message}"))  # fmt: skip
    elif folded.verdict == "RolledBack":
        events.append(("Warning", "CanaryRejected", f"revision {folded.candidate.revision} rolled back: "
                       f"{folded.message}"))  # fmt: skip
    return evolve(status, None, canary=folded), events, folded.verdict
