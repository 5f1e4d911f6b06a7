"""Closed-loop tuning of K and the per-batch-size schedule (`serving.tuning.mode: Auto`). Pure: a scrape's
judgement (planning/judgement.py) calls `plan_tuning` with the acceptance it just computed; the deployment
planner calls `applied` to render what was tuned.

Rules, so that Auto never fights the user and never flaps:
- Auto never writes the spec (GitOps would revert it): the tuned K and schedule live in `status.tuning`
  and are rendered only where the spec leaves K to the operator (`numSpeculativeTokens: auto`), within
  `minK..maxK` (maxK at most the checkpoint's speculative_tokens);
- a candidate K must beat the served K's predicted speedup by `hysteresis` (relative), and the evidence
  must point to the same candidate without a break (every judgement in between with enough samples)
  for `minIntervalSeconds` before a revision rolls; a judgement without enough samples starts afresh, so
  an operator restart (its window is in memory) or a rollout (the new revision's window starts empty)
  never acts on evidence it no longer holds;
- with `allowDisable`, a candidate of K = 0 (every K predicts a slowdown) rolls a revision without
  `--speculative-config`; after `probeIntervalSeconds` a probe revision speculates again with the last K
  so that acceptance is measured on real traffic, and the same rules decide whether it stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from speculator_operator.api.common import conditions_of, stored
from speculator_operator.api.deployment import (
    Acceptance,
    SpeculatorDeploymentSpec,
    SpeculatorDeploymentStatus,
    TuningStatus,
)
from speculator_operator.domain.economics import LoadModel, cutoff_schedule, draft_forwards, speedup
from speculator_operator.render.serving import Tuned
from speculator_operator.telemetry.acceptance import Economics


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def bounds(spec: SpeculatorDeploymentSpec, checkpoint_k: int) -> tuple[int, int]:
    """(lowest, highest) K Auto may choose: minK..maxK, maxK at most the checkpoint's."""
    t = spec.serving.tuning
    hi = min(t.max_k or checkpoint_k, checkpoint_k)
    return min(t.min_k, hi), hi


def leaves_k_to_operator(spec: SpeculatorDeploymentSpec) -> bool:
    return spec.serving.tuning.mode == "Auto" and spec.serving.num_speculative_tokens == "auto"


def applied(spec: SpeculatorDeploymentSpec, state: TuningStatus | None, checkpoint_k: int) -> Tuned | None:
    """The tuned K and schedule to render from `status.tuning`, or None (the spec's or checkpoint's K).
    The spec's current bounds win over an older tuned value."""
    if spec.serving.adaptive_verification:  # vLLM decides per step: nothing tuned is rendered
        return None
    if not leaves_k_to_operator(spec) or state is None or state.mode != "Auto" or state.k is None:
        return None
    k = state.k
    lo, hi = bounds(spec, checkpoint_k)
    if k == 0:
        if spec.serving.tuning.allow_disable:
            return Tuned(0)
        k = state.probe_k if state.probe_k is not None else hi
    clamped = max(lo, min(hi, k))
    if clamped != k or not state.schedule or any(len(r) != 3 for r in state.schedule):
        return Tuned(clamped)
    return Tuned(clamped, tuple((s, e, min(kk, clamped)) for s, e, kk in state.schedule))


def tuned_schedule(
    spec: SpeculatorDeploymentSpec,
    k: int,
    alpha: float,
    cost_ratio: float,
    algorithm: str,
    load: LoadModel | None = None,
) -> list[list[int]] | None:
    """The per-batch-size schedule for a tuned K: the best K ≤ `k` at every batch size up to maxNumSeqs
    (economics.cutoff_schedule), the steps' growth priced by the device class `load` model (status.economics.
    loadModel), else (a CPU) by `saturationTokens`; `cost_ratio` is the draft's batch-1 cost the precedence chose
    (sweep, live or prior). None where one K serves every batch size, or where the spec sets its own cutoff (the
    user's cut-off stands, rendered with the tuned K)."""
    if k < 1 or spec.serving.cutoff is not None:
        return None
    schedule = cutoff_schedule(
        alpha, cost_ratio, k, spec.serving.max_num_seqs, spec.serving.tuning.saturation_tokens, algorithm, load
    )
    if len(schedule.ranges) == 1:
        return None
    return schedule.as_list()


def candidate(
    spec: SpeculatorDeploymentSpec, alpha: float, econ: Economics, cost_ratio: float
) -> tuple[int, float, float]:
    """(the K Auto would serve, its predicted speedup, the served K's predicted speedup) for a measured α,
    hysteresis applied: the served K stays unless another beats it by the hysteresis fraction."""
    t = spec.serving.tuning
    lo, hi = bounds(spec, econ.max_k)

    def gain(k: int) -> float:
        return 1.0 if k == 0 else speedup(alpha, k, cost_ratio, draft_forwards(econ.algorithm, k))

    options = list(range(lo, hi + 1)) + ([0] if t.allow_disable else [])
    best = max(options, key=lambda k: (gain(k), -k))  # the smaller K on a tie: fewer draft forwards
    current = gain(econ.k)
    if best != econ.k and gain(best) < current * (1.0 + t.hysteresis):
        best = econ.k
    return best, gain(best), current


@dataclass
class TuningPlan:
    state: TuningStatus | None  # the new status.tuning (None: remove it)
    rollout: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


@dataclass
class _Judged:
    """What one judgement made of status.tuning, in its wire form (the rules below edit it key by key)."""

    state: dict[str, Any] | None
    rollout: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)


def blocked(status: SpeculatorDeploymentStatus) -> str | None:
    """Why a tuned revision may not roll now: a reconcile would also carry an input change the user has
    not let through (a paused verifier or draft change, a retraining in flight) or the pair is not served."""
    conditions = conditions_of(status)
    if status.retrain is not None:
        return "a retraining is in flight"
    if status.canary is not None and status.canary.state in ("Analyzing", "Promoting"):
        return "a canary is in flight (both sides serve the incumbent's K)"
    for kind in ("VerifierCurrent", "DraftCurrent"):
        found = conditions.get(kind)
        if found is not None and found.status == "False":
            return f"{kind} is False ({found.reason})"
    if status.phase not in ("Ready", "Deploying"):
        return f"the deployment is {status.phase}"
    return None


def plan_tuning(
    spec: SpeculatorDeploymentSpec,
    state: TuningStatus | None,
    acc: Acceptance | None,
    econ: Economics,
    now: float,
    min_samples: int,
    hold: str | None = None,
) -> TuningPlan:
    """The next status.tuning after one judgement of acceptance, and whether to roll a tuned revision.

    `econ.k` is the K served now (0: speculation off); `acc` is status.acceptance for the served revision
    (ignored while speculation is off: there is nothing to measure); `hold` (see `blocked`) says why no
    revision may roll now: the evidence is kept, the rollout waits."""
    judged = _plan(spec, None if state is None else stored(state), acc, econ, now, min_samples, hold)
    typed = None if judged.state is None else TuningStatus.model_validate(judged.state)
    return TuningPlan(typed, judged.rollout, judged.events)


def _plan(
    spec: SpeculatorDeploymentSpec,
    state: dict[str, Any] | None,
    acc: Acceptance | None,
    econ: Economics,
    now: float,
    min_samples: int,
    hold: str | None,
) -> _Judged:
    if spec.serving.tuning.mode != "Auto":
        return _Judged(None)
    if spec.serving.adaptive_verification:
        note = "serving.adaptiveVerification: vLLM trims verification per step, so Auto tunes neither K nor a schedule"
        return _Judged({"mode": "Auto", "note": note})
    if spec.serving.num_speculative_tokens != "auto":
        note = "numSpeculativeTokens is set in the spec: Auto leaves K to it and only recommends"
        return _Judged({"mode": "Auto", "note": note})
    new: dict[str, Any] = {k: v for k, v in (state or {}).items() if k != "note"}
    new["mode"] = "Auto"
    if econ.k == 0:
        plan = _while_disabled(spec, dict(new), econ, now)
    else:
        plan = _judge(spec, dict(new), acc, econ, now, min_samples)
    if plan.rollout and hold:
        return _Judged({**new, "note": f"a tuned revision waits: {hold}"})  # the evidence held stays held
    return plan


def _judge(
    spec: SpeculatorDeploymentSpec,
    new: dict[str, Any],
    acc: Acceptance | None,
    econ: Economics,
    now: float,
    min_samples: int,
) -> _Judged:
    """Speculation is on: act on the measured α."""
    t = spec.serving.tuning
    alpha = acc.alpha if acc is not None else None
    drafts = int((acc.drafts if acc is not None else None) or 0)
    if econ.cost_ratio is None or alpha is None or drafts < min_samples:
        new.pop("pending", None)  # no judgement: whatever pointed elsewhere must start again
        return _Judged(new)
    best, best_gain, current_gain = candidate(spec, float(alpha), econ, econ.cost_ratio)
    events: list[tuple[str, str, str]] = []
    if best != 0 and new.pop("probing", None):
        message = (
            f"the probe revision measured α {alpha:.3f} over {drafts} drafts: K={econ.k} predicts "
            f"{current_gain:.2f}x; speculation stays on"
        )
        events.append(("Normal", "SpeculationReenabled", message))
        new["evidence"] = message
    if best == econ.k:
        new.pop("pending", None)
        return _Judged(new, events=events)
    evidence = (
        f"α {alpha:.3f} over {drafts} drafts: K={best} predicts {best_gain:.2f}x against "
        f"{current_gain:.2f}x at K={econ.k}"
    )
    pending = new.get("pending") or {}
    since = epoch(pending.get("since"))
    if pending.get("k") != best or since is None:
        new["pending"] = {"k": best, "since": iso(now), "evidence": evidence}
        return _Judged(new, events=events)
    last = epoch(new.get("appliedAt"))
    if now - since < t.min_interval_seconds or (last is not None and now - last < t.min_interval_seconds):
        return _Judged(new, events=events)  # held, not long enough: no write until something changes
    new.pop("pending", None)
    new.pop("probing", None)
    new.update(
        k=best,
        appliedAt=iso(now),
        evidence=f"{evidence}, held {now - since:.0f} s",
        rollouts=int(new.get("rollouts") or 0) + 1,
        schedule=tuned_schedule(spec, best, float(alpha), econ.cost_ratio, econ.algorithm, econ.load),
    )
    if best == 0:
        new.update(probeAt=iso(now + t.probe_interval_seconds), probeK=econ.k)
        message = f"speculation off: {new['evidence']}; a probe revision measures again at {new['probeAt']}"
        events.append(("Normal", "SpeculationDisabled", message))
    else:
        new.pop("probeAt", None)
        new.pop("probeK", None)
        events.append(("Normal", "TunedK", f"K {econ.k} -> {best}: {new['evidence']}"))
    return _Judged({k: v for k, v in new.items() if v is not None}, rollout=True, events=events)


def _while_disabled(spec: SpeculatorDeploymentSpec, new: dict[str, Any], econ: Economics, now: float) -> _Judged:
    """Speculation is off: nothing to measure until the probe is due; then a probe revision with the last K."""
    t = spec.serving.tuning
    new.pop("pending", None)
    probe_at = epoch(new.get("probeAt"))
    if probe_at is None:
        new["probeAt"] = iso(now + t.probe_interval_seconds)
        return _Judged(new)
    if now < probe_at:
        return _Judged(new)
    lo, hi = bounds(spec, econ.max_k)
    probe_k = new.get("probeK")
    k = max(lo, min(hi, probe_k if isinstance(probe_k, int) else hi))
    message = f"speculation has been off since {new.get('appliedAt')}: a probe revision with K={k} measures acceptance"
    new.update(k=k, appliedAt=iso(now), probing=True, rollouts=int(new.get("rollouts") or 0) + 1)
    new.pop("probeAt", None)
    new.pop("schedule", None)
    new["evidence"] = message
    return _Judged(new, rollout=True, events=[("Normal", "ProbingAcceptance", message)])
