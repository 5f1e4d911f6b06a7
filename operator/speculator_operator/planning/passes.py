"""Why an object is enqueued, and which steps its pass runs for those causes: pure rules, so that what a pass
does for a set of causes is tested without a cluster (runtime/controller.py runs the passes; the table of
which trigger enqueues which cause is in docs/design/runtime.md)."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from enum import StrEnum


class Cause(StrEnum):
    SPEC = "spec"  # a generation the last pass did not read (and every object when the operator starts)
    CHILD = "child"  # a child Deployment, a stuck pod, a stage Job finished, a server ready
    DRIFT = "drift"  # a child deleted, or changed by another manager (held for the pass)
    TRAINJOB = "trainjob"  # a train job the deployment serves finished
    RESYNC = "resync"  # the periodic comparison with the children
    POLL = "poll"  # upgradePolicy: the inputs' revisions are due to be resolved again
    SCRAPE = "scrape"  # an acceptance scrape whose judgement changed materially (held for the pass)
    PROGRESS = "progress"  # a stage's log said something new (held for the pass)
    RETRY = "retry"  # the pass itself, later: an input could not be read, or the apply failed
    REQUEST = "request"  # a one-shot request annotation with a new value (planning/requests.py)


# Quick causes: a pass that only folds in what a child, a scrape or a log said (no audit, no checkpoint read).
# Such a key is taken before the others, and some workers take nothing else (runtime/workqueue.py): measured at
# 1,000 new SpeculatorDeployments, a child's readiness otherwise waited behind the others' audits.
DEPLOYMENT_QUICK = frozenset({Cause.CHILD, Cause.RESYNC, Cause.SCRAPE})
TRAINJOB_QUICK = frozenset({Cause.CHILD, Cause.RESYNC, Cause.PROGRESS})

# The priority of a pass asked for by a child whose ready count moved (others: 0), within its lane: at 1,000 new
# SpeculatorDeployments each child's rollout asks for two or three quick passes and the scrape for one more, and
# only the one after readiness moved can make its owner Ready (docs/design/runtime.md).
READINESS_PRIORITY = 1

# causes that always ask a SpeculatorDeployment's pass for the whole reconcile
FULL = frozenset({Cause.SPEC, Cause.RETRY, Cause.TRAINJOB})
# causes that ask it for the replica counts and the readiness again
SERVING = frozenset({Cause.CHILD, Cause.RESYNC, Cause.DRIFT})


class Step(StrEnum):
    RECONCILE = "reconcile"  # observe the inputs, audit, plan, apply the children
    RESTORE = "restore"  # the same, the children applied with force: one was changed or deleted by hand
    POLL = "poll"  # resolve the inputs' revisions and act on a change (a reconcile if they moved)
    REFRESH = "refresh"  # the serving counts and readiness from the child Deployment


@dataclass(frozen=True)
class DeploymentSteps:
    main: Step | None  # RECONCILE, RESTORE, POLL or none
    refresh: bool  # REFRESH after it, unless the main step reconciled (a poll may): a reconcile reads the child
    cause: str  # the status-write cause the main step's changes are counted under


def deployment_steps(
    causes: Set[str],
    *,
    moved: bool,
    tuned: bool,
    pinned: bool,
    restoring: bool,
    valid: bool,
    resume: bool = False,
    resolve: bool = False,
    decided: bool = False,
) -> DeploymentSteps:
    """The steps of a SpeculatorDeployment's pass, in order, after the acceptance judgement:
    - the whole reconcile when the generation moved, a cause asks for it (FULL) or the judgement tuned K;
      never while the pair is pinned for a retrain (the retrained draft's hand-off moves it);
    - else a restoration when a held drift still stands;
    - else the input poll when one is due (and the spec is valid);
    - then the serving counts when a SERVING cause came and nothing reconciled.
    `moved`: a generation its last pass did not read; `tuned`: the judgement chose another K; `pinned`: a retrain
    holds the pair; `restoring`: a drift read again still stands; `valid`: the spec validates; `resume`: a request
    to roll out a paused change (a reconcile, which reads the inputs as they are now); `resolve`: a request to
    resolve the revisions now (the poll, whatever its interval); `decided`: the judgement reached a canary's verdict
    (the reconcile promotes or rolls back)."""
    main: Step | None = None
    cause = ""
    if (moved or causes & FULL or tuned or resume or decided) and not pinned:
        main = Step.RESTORE if restoring else Step.RECONCILE
        cause = "tuning" if tuned else Cause.TRAINJOB.value if set(causes) == {Cause.TRAINJOB} else "reconcile"
        cause = "canary" if decided and not (moved or causes & FULL or tuned) else cause
        if resume and not (moved or causes & FULL or tuned):
            cause = Cause.REQUEST.value
    elif restoring:
        main, cause = Step.RESTORE, "restore"
    elif (Cause.POLL in causes or resolve) and valid:
        main, cause = Step.POLL, Cause.REQUEST.value if resolve and Cause.POLL not in causes else "poll"
    reconciles = main in (Step.RECONCILE, Step.RESTORE)
    refresh = not reconciles and bool(causes & SERVING) and valid
    return DeploymentSteps(main, refresh, cause)


def refresh_cause(causes: Set[str]) -> str:
    """The status-write cause of a refresh: a resync's own, or a child's."""
    return Cause.RESYNC.value if set(causes) & SERVING == {Cause.RESYNC} else Cause.CHILD.value


def trainjob_progress_only(causes: Set[str]) -> bool:
    """A train job's pass woken only by a progress line folds it in and plans nothing (the stage machine has
    nothing new to decide from it)."""
    return set(causes) == {Cause.PROGRESS}
