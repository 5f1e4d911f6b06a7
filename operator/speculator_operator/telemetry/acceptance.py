"""What vLLM's spec-decode figures say (docs/reference/vllm.md §5): `status.acceptance` from a window's totals, and
the `SpeculationEffective` condition, and when either is worth a write. Pure: telemetry/vllm_metrics.py reads the
metrics into windows, controllers/telemetry.py scrapes and writes.

- rate = accepted / drafted tokens; mean accepted length L = 1 + accepted / drafts (the bonus token
  included, 1..K+1);
- α, the per-position acceptance of the economics model, solves E(α, K) = L: the raw rate is not α
  (at α = 0.2, K = 3 the rate is ≈ 0.083 while α* ≈ 0.128 and speculation still pays);
- per position p: drafts whose first p+1 tokens were accepted / drafts (unconditional, as vLLM counts);
- pods of another revision than the one served now are not counted, and said so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from speculator_operator.api.common import Condition, conditions_of, evolve, make_condition, stored
from speculator_operator.api.deployment import Acceptance, PairEconomics, SpeculatorDeploymentStatus, TuningStatus
from speculator_operator.domain.economics import (
    LoadModel,
    alpha_from_mean_length,
    best_k,
    break_even_alpha,
    draft_forwards,
    speedup,
)
from speculator_operator.telemetry.vllm_metrics import Totals

SPECULATING = 0.9  # the share of a window's request-steps that must have drafted for its step time to price a draft
CONDITION = "SpeculationEffective"
ADAPTIVE = "AdaptiveVerification"  # status.acceptance.basis, and the condition's reason without a measured speedup
MAX_FAILING_LISTED = 10


@dataclass(frozen=True)
class Economics:
    """What the served pair costs: K as served, the algorithm, the draft/verifier cost ratio (None when
    the verifier's config was not readable) and the largest K the checkpoint allows."""

    k: int
    algorithm: str
    cost_ratio: float | None
    max_k: int
    source: str = "parameters"  # where cost_ratio comes from: prior, parameters, sweep or live (status.economics)
    plain_steps: tuple[tuple[float, float], ...] = ()  # the sweep's plain step time (batch, ms) on this device class
    load: LoadModel | None = None  # the device class load model (None: the saturation model, as on a CPU)


def economics_of(status: SpeculatorDeploymentStatus) -> Economics | None:
    """What the served pair costs, from its status: the measured cost where there is one (a sweep on this device
    class, or the live cost since: planning/measured.py), else the prior's (or the parameters'), and the device class
    load model that prices a schedule under load. None while nothing is served."""
    k, algorithm = status.num_speculative_tokens, status.algorithm
    if k is None or k < 0 or not algorithm:  # 0: speculation switched off
        return None
    econ = status.economics or PairEconomics()
    max_k = econ.max_k if econ.max_k is not None else k
    measured = econ.effective_cost_ratio is not None
    cost = econ.effective_cost_ratio if measured else econ.cost_ratio
    steps = tuple((float(b), float(ms)) for b, ms in econ.plain_steps or [] if ms)
    # unmeasured: the device class prior, or the parameter ratio an operator before the prior wrote
    unmeasured = "prior" if econ.source == "prior" else "parameters"
    source = econ.source if measured and econ.source else unmeasured
    load = None if econ.load_model is None else LoadModel(**econ.load_model.model_dump())
    return Economics(
        k=k, algorithm=algorithm, cost_ratio=cost, max_k=max_k, source=source, plain_steps=steps, load=load
    )


def priced(econ: Economics, acc: Acceptance | None) -> Economics:
    """`econ` with the live cost this judgement's figures used, where they used one: tuning prices K with it too."""
    if acc is not None and acc.cost_source == "live" and acc.cost_ratio is not None:
        return replace(econ, cost_ratio=acc.cost_ratio)
    return econ


@dataclass(frozen=True)
class LiveCost:
    """The draft's effective cost from the window's step times against the sweep's plain ones at the same batch."""

    cost_ratio: float
    step_ms: float
    batch: float
    plain_step_ms: float


def live_cost(totals: Totals, econ: Economics, min_samples: int) -> LiveCost | None:
    """c = (T_live / T_plain(B) − 1) / n: T_live the window's mean step time a request saw, B its mean batch (request-
    steps per engine step), T_plain(B) the sweep's plain step time there (planning/measured.py interpolates), n the
    draft forwards at the served K. None without a sweep on this device class, with fewer than `min_samples` drafts, or
    where under SPECULATING of the window's request-steps drafted (a schedule's K = 0 steps, a mixed window)."""
    if not econ.plain_steps or econ.k < 1 or totals.drafts < min_samples or totals.itl_count <= 0 or totals.steps <= 0:
        return None
    if totals.drafts < SPECULATING * totals.itl_count:
        return None
    step_ms = 1000.0 * totals.itl_sum / totals.itl_count
    batch = totals.itl_count / totals.steps
    plain = interpolate(econ.plain_steps, batch)
    if plain <= 0 or step_ms <= 0:
        return None
    c = max(0.0, (step_ms / plain - 1.0) / draft_forwards(econ.algorithm, econ.k))
    return LiveCost(c, step_ms, batch, plain)


def interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """y at x, linear between the (x, y) points (sorted by x), the end values beyond them."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return pts[-1][1]


def _r(x: float, digits: int = 4) -> float:
    return round(x, digits)


def first_measure_due(
    status: SpeculatorDeploymentStatus, ready_targets: bool, ready_since: float | None, now: float, interval: float
) -> bool:
    """Whether to scrape now. Once a measure is on record: always. Before the first: when a serving pod is
    ready and either the resource is Ready or a pod has been ready for a whole scrape interval (a rollout
    stuck short of all replicas is still measured). A pod that has just turned ready has served nothing to
    count, and measuring it before its resource is Ready only adds a status write to the rollout."""
    if status.acceptance is not None:
        return True
    if not ready_targets:
        return False
    if status.phase == "Ready":
        return True
    return ready_since is not None and now - ready_since >= interval


def acceptance_status(
    totals: Totals,
    econ: Economics,
    *,
    revision: str | None,
    observed_at: str,
    min_samples: int,
    adaptive: bool = False,
) -> Acceptance:
    """`status.acceptance` from a window's totals. `adaptive`: vLLM verifies adaptively (serving.adaptiveVerification),
    so the counters do not describe the draft's α: the speedup is measured from live step times instead."""
    out: dict[str, Any] = {
        "basis": ADAPTIVE if adaptive else "Drafts",
        "revision": revision,
        "k": econ.k,
        "observedAt": observed_at,
        "drafts": int(totals.drafts),
        "windowSeconds": round(totals.span),
        "pods": {"counted": totals.counted},
        "load": {
            "requestsRunning": _r(totals.running, 2),
            "generationTokensPerSecond": _r(totals.generated / totals.span, 2) if totals.span > 0 else 0.0,
        },
    }
    if totals.failing:
        out["pods"]["failing"] = [
            {"pod": pod, "reason": reason, "message": message[:300]}
            for pod, (reason, message) in list(totals.failing.items())[:MAX_FAILING_LISTED]
        ]
    if totals.other_revision:
        out["pods"]["otherRevision"] = totals.other_revision
    if totals.resets:
        out["pods"]["counterResets"] = totals.resets
    if totals.draft_tokens <= 0 or totals.drafts <= 0:
        return Acceptance.model_validate(out)
    mean_length = 1.0 + totals.accepted / totals.drafts
    out.update(
        rate=_r(totals.accepted / totals.draft_tokens),
        percent=f"{100 * totals.accepted / totals.draft_tokens:.1f}%",
        meanAcceptedLength=_r(mean_length),
        perPosition=[_r(v / totals.drafts) for v in totals.per_position[: econ.k]],
    )
    live = live_cost(totals, econ, min_samples)
    if adaptive:
        # each step gained meanAcceptedLength tokens at stepMs where plain decoding takes plainStepMs for one
        if live is not None:
            gain = mean_length * live.plain_step_ms / live.step_ms
            out.update(predictedSpeedup=_r(gain, 3), costSource="live", stepMs=_r(live.step_ms, 3),
                       plainStepMs=_r(live.plain_step_ms, 3), batch=_r(live.batch, 2))  # fmt: skip
        if totals.drafts < min_samples:
            out["note"] = f"{int(totals.drafts)} drafts in the window, {min_samples} needed to judge"
        return Acceptance.model_validate({k: v for k, v in out.items() if v is not None})
    alpha = alpha_from_mean_length(mean_length, econ.k)
    out["alpha"] = _r(alpha)
    cost, source = (live.cost_ratio, "live") if live is not None else (econ.cost_ratio, econ.source)
    if cost is not None:
        n = draft_forwards(econ.algorithm, econ.k)
        star = break_even_alpha(econ.k, cost, n)
        out["breakEvenAlpha"] = None if star is None else _r(star)
        out["predictedSpeedup"] = _r(speedup(alpha, econ.k, cost, n), 3)
        out["recommendedK"] = best_k(alpha, cost, econ.algorithm, max(1, econ.max_k))[0]
        out["costSource"] = source
        out["costRatio"] = _r(cost, 6)
    if live is not None:
        out["stepMs"] = _r(live.step_ms, 3)
        out["plainStepMs"] = _r(live.plain_step_ms, 3)
        out["batch"] = _r(live.batch, 2)
    if totals.drafts < min_samples:
        out["note"] = f"{int(totals.drafts)} drafts in the window, {min_samples} needed to judge"
    return Acceptance.model_validate({k: v for k, v in out.items() if v is not None})


def effective_condition(acc: Acceptance, generation: int, min_samples: int) -> Condition:
    """SpeculationEffective: True when the predicted speedup exceeds 1, False below break-even, Unknown
    without enough evidence (NotEnoughSamples) or without metrics (NoMetrics)."""
    if acc.pods is None or not acc.pods.counted:
        failing = (acc.pods.failing if acc.pods else None) or []
        why = "; ".join(f"{f['pod']}: {f['reason']}" for f in failing[:3]) or "no ready serving pod to scrape"
        return make_condition(generation, CONDITION, None, "NoMetrics", why)
    drafts = int(acc.drafts or 0)
    alpha = acc.alpha
    if acc.basis == ADAPTIVE and drafts >= min_samples:
        return _adaptive_condition(acc, generation, drafts)
    if drafts < min_samples or alpha is None:
        return make_condition(
            generation, CONDITION, None, "NotEnoughSamples", f"{drafts} drafts in the window, {min_samples} needed"
        )
    gain = acc.predicted_speedup
    if gain is None:
        return make_condition(
            generation,
            CONDITION,
            None,
            "NoCostModel",
            f"acceptance {alpha} measured, but the verifier's config was not readable to price the draft",
        )
    star = acc.break_even_alpha
    numbers = (
        f"α {alpha:.3f} (rate {acc.rate or 0.0:.3f}, mean accepted length {acc.mean_accepted_length or 0.0:.2f}), "
        f"break-even α* {'none: it never pays' if star is None else f'{star:.3f}'}, "
        f"predicted speedup {gain:.2f}x at K={acc.k if acc.k is not None else '?'}, over {drafts} drafts"
    )
    if gain > 1.0:
        return make_condition(generation, CONDITION, True, "AboveBreakEven", numbers)
    return make_condition(generation, CONDITION, False, "BelowBreakEven", numbers)


def _adaptive_condition(acc: Acceptance, generation: int, drafts: int) -> Condition:
    """Under adaptive verification, judged on the measured speedup (live step times), else Unknown."""
    gain = acc.predicted_speedup
    if gain is None:
        return make_condition(generation, CONDITION, None, ADAPTIVE, "vLLM verifies adaptively, so the counters do "
                              f"not give the draft's α (mean accepted length {acc.mean_accepted_length or 0.0:.2f} "
                              f"over {drafts} drafts); the gain is measured from live step times against the sweep's "
                              "plain step on this device class, and there is none yet")  # fmt: skip
    numbers = (f"measured speedup {gain:.2f}x: mean accepted length {acc.mean_accepted_length or 0.0:.2f} a step of "
               f"{acc.step_ms or 0.0:.2f} ms against plain decoding's {acc.plain_step_ms or 0.0:.2f} ms at batch "
               f"{acc.batch or 0.0:.1f}, over {drafts} drafts (adaptive verification)")  # fmt: skip
    if gain > 1.0:
        return make_condition(generation, CONDITION, True, "AboveBreakEven", numbers)
    return make_condition(generation, CONDITION, False, "BelowBreakEven", numbers)


# what a status write compares: a move smaller than these steps is not worth a write. A step, not a rounding: two
# values either side of a rounding boundary are close, and a live figure hovering there would be written every scrape.
MATERIAL = {"rate": 0.01, "alpha": 0.01, "mean_accepted_length": 0.01, "predicted_speedup": 0.01,
            "break_even_alpha": 0.01, "cost_ratio": 0.01}  # fmt: skip


def _material_view(acc: Acceptance | None) -> tuple[Any, ...]:
    """What must be equal for two judgements to be the same, besides MATERIAL's figures."""
    if acc is None:
        return ()
    pods = acc.pods
    failing = tuple(sorted((f["pod"], f["reason"]) for f in (pods.failing if pods else None) or []))
    return (
        len(acc.per_position or []),
        acc.recommended_k,
        acc.revision,
        pods.counted if pods else None,
        pods.other_revision if pods else None,
        pods.counter_resets if pods else None,
        failing,
        acc.note is not None,
        acc.cost_source,
    )


def _moved(old: float | None, new: float | None, step: float) -> bool:
    if old is None or new is None:
        return old is not new
    return abs(float(new) - float(old)) >= step - 1e-12


def changed_materially(old: Acceptance | None, new: Acceptance) -> bool:
    """Whether a write is worth it. The drafts count alone is not: a window holding two or three scrapes'
    increments swings by a third from one scrape to the next under constant traffic (the operator's gauge
    speculator_acceptance_drafts carries the live count)."""
    if old is None or _material_view(old) != _material_view(new):
        return True
    if any(_moved(getattr(old, key), getattr(new, key), step) for key, step in MATERIAL.items()):
        return True
    return any(_moved(a, b, 0.01) for a, b in zip(old.per_position or [], new.per_position or [], strict=True))


def disabled_condition(
    generation: int, tuning: TuningStatus | None, economics: PairEconomics | None = None
) -> Condition:
    """SpeculationEffective while speculation is off: False, with why. Tuning turned it off (and says when it measures
    again), or the draft's measured sweep found plain decoding at least as fast on this device class."""
    measured_off = economics is not None and economics.schedule_from == "sweep"
    if measured_off and (tuning is None or tuning.k != 0):
        message = ("the draft's measured sweep found plain decoding at least as fast at every concurrency on this "
                   "device class (status.economics); set numSpeculativeTokens to speculate anyway")  # fmt: skip
        return make_condition(generation, CONDITION, False, "SpeculationDisabled", message)
    state = tuning or TuningStatus()
    message = f"tuning switched speculation off ({state.evidence or 'below break-even'})"
    if state.probe_at:
        message += f"; a probe revision measures acceptance again at {state.probe_at}"
    return make_condition(generation, CONDITION, False, "SpeculationDisabled", message)


@dataclass
class Update:
    """What one judgement writes: the status after it (None: nothing changed, no write), and events."""

    status: SpeculatorDeploymentStatus | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def plan_update(
    current: SpeculatorDeploymentStatus,
    acc: Acceptance | None,
    cond: Condition,
    tuning: TuningStatus | None,
    refilling: bool = False,
    *,
    now: datetime,
) -> Update:
    """The status and events after one judgement: acceptance only when it changed materially, the condition
    when its status or reason changed (its numbers only together with a material change), tuning when it
    changed; one event per transition of the condition: a Warning into False, a Normal into True. `now`: the
    judgement's time (a transition of the condition).

    `refilling`: the window is younger than its span since the operator (re)started. While it has too few
    samples, the judgement on record for the same revision stands (a restart is not news: no writes, no
    events); a judgement on another revision, or none, is replaced as usual."""
    out = Update()
    old_acc = current.acceptance
    old = conditions_of(current).get(CONDITION)
    old_status, old_reason = (old.status, old.reason) if old is not None else (None, None)
    if (
        refilling
        and cond.reason == "NotEnoughSamples"
        and old is not None
        and old_status in ("True", "False")
        and acc is not None
        and (old_acc.revision if old_acc else None) == acc.revision
    ):
        acc, cond = None, old
    changes: dict[str, Any] = {}
    material = acc is not None and changed_materially(old_acc, acc)
    if acc is not None and material:
        changes["acceptance"] = acc
    moved = (old_status, old_reason) != (cond.status, cond.reason)
    new = current
    if moved or (material and (old.message if old else None) != cond.message):
        new = evolve(current, None, cond, now=now)
        if cond.status == "False" and old_status != "False":
            out.events.append(("Warning", cond.reason, cond.message))
        elif cond.status == "True" and old_status != "True":
            out.events.append(("Normal", cond.reason, cond.message))
    if _block(tuning) != _block(current.tuning):
        changes["tuning"] = tuning
    economics = live_economics(current.economics, acc)
    if economics is not None:
        changes["economics"] = economics
    if changes:
        new = evolve(new, None, **changes)
    if new is not current:
        out.status = new
    return out


def live_economics(current: PairEconomics | None, acc: Acceptance | None) -> PairEconomics | None:
    """status.economics with the live cost the window measured, where it moved materially (MATERIAL's step) or
    was not live before; None: nothing to write."""
    if current is None or acc is None or acc.cost_source != "live" or acc.cost_ratio is None:
        return None
    old = current.effective_cost_ratio
    if current.source == "live" and not _moved(old, acc.cost_ratio, MATERIAL["cost_ratio"]):
        return None
    return current.model_copy(update={"source": "live", "effective_cost_ratio": acc.cost_ratio})


def _block(block: TuningStatus | None) -> dict[str, Any] | None:
    """A status block's wire form (None stays None), to compare two of them."""
    return None if block is None else stored(block)
