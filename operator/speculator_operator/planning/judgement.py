"""A scrape's judgement folded into the deployment's status: status.acceptance, the SpeculationEffective condition
and status.tuning (telemetry/acceptance.py says what acceptance means, planning/tuning.py what K to serve). Pure: the
scrape job (controllers/telemetry.py) judges its own copy to know whether a pass is worth it, and the pass the status
it read, each at the time it hands in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from speculator_operator.api.common import Condition
from speculator_operator.api.deployment import Acceptance, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.planning.tuning import blocked, plan_tuning
from speculator_operator.telemetry.acceptance import economics_of, plan_update, priced
from speculator_operator.telemetry.canary import Measured


@dataclass(frozen=True)
class Judged:
    """What one scrape observed, held for the deployment's next pass: the acceptance window's figures (None
    while speculation is off), the SpeculationEffective condition, and whether the window is still filling."""

    acc: Acceptance | None
    cond: Condition
    refilling: bool
    canary: tuple[Measured, ...] = ()  # a canary's analysis intervals measured since the last pass, in order


def judge(
    spec: SpeculatorDeploymentSpec,
    current: SpeculatorDeploymentStatus,
    judged: Judged,
    generation: int,
    *,
    now: datetime,
) -> tuple[SpeculatorDeploymentStatus | None, bool, list[tuple[str, str, str]]]:
    """The status after a scrape's judgement at `now` (None: nothing to write), whether a tuned K rolls a new
    revision (the tuned state is then in that status: the render reads it from there), and the events."""
    econ = economics_of(current)
    if econ is None:
        return None, False, []
    tuning = spec.serving.tuning
    tuned = plan_tuning(
        spec, current.tuning, judged.acc, priced(econ, judged.acc), now.timestamp(), tuning.min_samples,
        blocked(current),
    )  # fmt: skip
    update = plan_update(current, judged.acc, judged.cond, tuned.state, judged.refilling, now=now)
    return update.status, tuned.rollout and update.status is not None, update.events + tuned.events
