"""When a draft that keeps learning (`spec.learning`, docs/concepts/learning.md) starts a learning run: the live
baseline, drift against it, the samples captured since the last run, and the gates that hold a trigger back. Pure:
the time is handed in, and nothing here reads or writes the cluster.

The rule, per pass, on the acceptance windows measured since the last one:
- a window counts once: one ending at or before `countedUntil` is ignored, so the same windows fed again change
  nothing (an operator restart, a pass run twice);
- a window of another draft or verifier revision than the one served, or with fewer than the canary's `minDrafts`
  drafts (or no α), counts neither way: no traffic is no evidence, as in the canary;
- the first `baselineWindows` counted windows of a draft revision make its live baseline (their drafts-weighted
  mean α); a new draft revision (a promotion) or verifier revision starts a new one;
- after that, a counted window with α below baseline - margin adds one to `belowWindows`, one at or above it sets
  it back to 0; drift holds at `belowWindows >= windows`, so noise (below, above, below) never fires;
- a trigger needs `minNewSamples` captured samples of the current verifier revision since the last run, and with
  `drift` also drift; no gate may hold (`blocked` names the first that does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from speculator_operator.api.canary import Canary
from speculator_operator.api.common import conditions_of, evolve, stamp
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.learning import Learning, LearningBaseline, LearningRun, LearningStatus, LearningTrigger

# within this of the threshold a window is not below it (floating-point sums of the same figures)
EPSILON = 1e-9


@dataclass(frozen=True)
class Window:
    """One measured window of the served revision's pods: its acceptance, and what the capture counted in it
    (increments over the window, counter resets already taken out by the scraper)."""

    end: str  # RFC 3339
    alpha: float | None
    drafts: int
    draft_revision: str | None
    verifier_revision: str | None
    captured: int = 0
    skipped: int = 0
    dropped: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class Fire:
    """A trigger that holds: a learning run starts, for `reason`."""

    reason: Literal["Drift", "Samples"]
    message: str


@dataclass(frozen=True)
class Planned:
    """What one pass of the trigger comes to: the new status.learning, the trigger that fired (None: none), and
    the events to say."""

    learning: LearningStatus
    fire: Fire | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _min_drafts(spec: SpeculatorDeploymentSpec) -> int:
    """The drafts a window needs to count: the canary's minDrafts, so that drift and the canary that judges the
    learned draft read the same evidence (the spec's CEL rule makes learning need a canary)."""
    return (spec.upgrade_policy.canary or Canary()).min_drafts


def _baseline(baseline: LearningBaseline | None, w: Window, alpha: float, wanted: int) -> tuple[LearningBaseline, bool]:
    """The baseline with one counted window folded in, and whether that window completed it."""
    if baseline is None:
        assert w.draft_revision is not None
        return LearningBaseline(value=alpha, draft_revision=w.draft_revision, windows=1, drafts=w.drafts,
                                since=w.end, complete=wanted <= 1), wanted <= 1  # fmt: skip
    drafts = baseline.drafts + w.drafts
    value = (baseline.value * baseline.drafts + alpha * w.drafts) / drafts
    windows = baseline.windows + 1
    done = windows >= wanted
    return evolve(baseline, None, value=value, windows=windows, drafts=drafts, complete=done), done


def _gate(policy: Learning, learning: LearningStatus, status: SpeculatorDeploymentStatus, now: datetime) -> str | None:
    """Why no trigger may fire now, in words (the first gate that holds), or None."""
    job = learning.job
    if job is not None and job.state == "Running":
        return f"a learning run is in flight: SpeculatorTrainJob {job.name}"
    if job is not None and job.state == "Succeeded" and job.verdict is None:
        return f"a learning run awaits its canary's verdict: SpeculatorTrainJob {job.name}"
    if status.retrain is not None:
        return (f"a retraining is in flight: SpeculatorTrainJob {status.retrain.job} for verifier "
                f"{status.retrain.verifier_revision}")  # fmt: skip
    verifier = conditions_of(status).get("VerifierCurrent")
    if verifier is not None and verifier.status == "False":
        return f"the verifier is changing ({verifier.reason})"
    canary = status.canary
    if canary is not None and canary.state in ("Analyzing", "Promoting"):
        return f"a canary is {canary.state.lower()}: revision {canary.candidate.revision}"
    if learning.next_trigger_at is not None and now < _at(learning.next_trigger_at):
        return (
            f"the cooldown holds until {learning.next_trigger_at} (cooldownSeconds {policy.trigger.cooldown_seconds})"
        )
    if learning.rejected_at_samples is not None:
        since = (learning.captured or 0) - learning.rejected_at_samples
        if since < policy.trigger.min_new_samples:
            return (f"a learned draft was rolled back: {since} of {policy.trigger.min_new_samples} new samples "
                    "captured since")  # fmt: skip
    return None


def plan_trigger(
    spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus, windows: Sequence[Window], now: datetime
) -> Planned:
    """status.learning after the `windows` measured since the last pass (any order; those counted before are
    ignored), and whether a learning run starts now. Without spec.learning nothing changes."""
    previous = status.learning or LearningStatus()
    policy = spec.learning
    if policy is None:
        return Planned(previous)
    drift = policy.trigger.drift
    verifier, draft = status.verifier_revision, status.draft_revision
    events: list[tuple[str, str, str]] = []

    learning = previous
    if verifier is not None and learning.verifier_revision != verifier:
        # samples and acceptance of another verifier say nothing about this one
        learning = evolve(learning, None, verifier_revision=verifier, samples_since_run=0, baseline=None,
                          below_windows=None)  # fmt: skip
    baseline = learning.baseline
    below = learning.below_windows or 0
    if baseline is not None and baseline.draft_revision != draft:
        baseline, below = None, 0  # a new draft serves: its own baseline
    counted_until = learning.counted_until
    captured, skipped = learning.captured or 0, learning.skipped or 0
    dropped, written = learning.dropped or 0, learning.bytes or 0
    samples = learning.samples_since_run or 0
    min_drafts = _min_drafts(spec)

    for w in sorted(windows, key=lambda w: _at(w.end)):
        if counted_until is not None and _at(w.end) <= _at(counted_until):
            continue
        counted_until = w.end
        captured, skipped, dropped, written = (
            captured + w.captured, skipped + w.skipped, dropped + w.dropped, written + w.bytes
        )  # fmt: skip
        if w.verifier_revision != verifier:
            continue  # not this verifier's: neither its samples nor its acceptance count
        samples += w.captured
        if drift is None or w.draft_revision != draft or w.alpha is None or w.drafts < min_drafts:
            continue
        if baseline is None or not baseline.complete:
            baseline, done = _baseline(baseline, w, w.alpha, drift.baseline_windows)
            if done:
                events.append(("Normal", "LearningBaselineSet", f"live baseline α {baseline.value:.4f} for draft "
                               f"{baseline.draft_revision} over {baseline.windows} windows ({baseline.drafts} "
                               "drafts)"))  # fmt: skip
            continue
        below = below + 1 if w.alpha < baseline.value - drift.margin - EPSILON else 0

    next_at = None
    if learning.last_trigger is not None:  # from the cooldown as it is now: an edit of it applies at once
        next_at = stamp(_at(learning.last_trigger.at) + timedelta(seconds=policy.trigger.cooldown_seconds))
    learning = evolve(
        learning,
        None,
        captured=captured,
        skipped=skipped,
        dropped=dropped,
        bytes=written,
        samples_since_run=samples,
        counted_until=counted_until,
        baseline=baseline,
        below_windows=below if drift is not None else None,
        next_trigger_at=next_at,
    )
    blocked = _gate(policy, learning, status, now)
    learning = evolve(learning, None, blocked=blocked)
    fire = _fires(policy, learning) if blocked is None else None
    if fire is None:
        return Planned(learning, None, events)
    learning = evolve(
        learning,
        None,
        last_trigger=LearningTrigger(at=stamp(now), reason=fire.reason, message=fire.message),
        samples_since_run=0,  # the run's snapshot takes them
        below_windows=0 if drift is not None else None,
        next_trigger_at=stamp(now + timedelta(seconds=policy.trigger.cooldown_seconds)),
    )
    events.append(("Normal", "LearningTriggered", f"{fire.reason}: {fire.message}"))
    return Planned(learning, fire, events)


def _fires(policy: Learning, learning: LearningStatus) -> Fire | None:
    """The trigger that holds on `learning` (no gate considered), or None."""
    samples, wanted = learning.samples_since_run or 0, policy.trigger.min_new_samples
    if samples < wanted:
        return None
    drift = policy.trigger.drift
    if drift is None:
        return Fire("Samples", f"{samples} new samples captured (minNewSamples {wanted})")
    baseline, below = learning.baseline, learning.below_windows or 0
    if baseline is None or not baseline.complete or below < drift.windows:
        return None
    return Fire("Drift", f"live α below the baseline {baseline.value:.4f} - margin {drift.margin:g} for {below} "
                f"windows in a row (windows {drift.windows}); {samples} new samples captured (minNewSamples "
                f"{wanted})")  # fmt: skip


def run_started(learning: LearningStatus, name: str, snapshot: str, samples: int, now: datetime) -> LearningStatus:
    """The learning run a trigger started: its SpeculatorTrainJob, on a snapshot of `samples` captured samples."""
    run = LearningRun(name=name, snapshot=snapshot, samples=samples, state="Running", started_at=stamp(now))
    return evolve(learning, None, job=run)


def run_finished(learning: LearningStatus, state: Literal["Succeeded", "Failed"], now: datetime) -> LearningStatus:
    """The learning run's train job ended. A failed run ends the run (the next trigger may fire); a succeeded one
    holds further triggers until its draft's canary gives a verdict (`judged`)."""
    if learning.job is None:
        return learning
    return evolve(learning, None, job=evolve(learning.job, None, state=state, finished_at=stamp(now)))


def judged(learning: LearningStatus, verdict: Literal["Promoted", "RolledBack"]) -> LearningStatus:
    """The learned draft's canary verdict. A rolled-back one holds the next trigger until minNewSamples more are
    captured (`rejectedAtSamples`): the same data would train the same draft."""
    if learning.job is None:
        return learning
    out = evolve(learning, None, job=evolve(learning.job, None, verdict=verdict))
    if verdict == "RolledBack":
        out = evolve(out, None, rejected_at_samples=learning.captured or 0)
    return out
