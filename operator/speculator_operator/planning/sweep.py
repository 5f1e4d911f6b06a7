"""The train job's sweep stages as the stage machine sees them (render/training/sweep.py): the curve assembled from
their reports once every one has succeeded, the words of one that failed, and a sweep server that was never ready.
Nothing partial is published as whole: the curve exists only when every planned stage reported its points and they
agree (domain/sweep.py checks one device and every (K, concurrency) point)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speculator_operator.api.podcontract import StageReport
from speculator_operator.domain.sweep import Curve, SweepError, assemble
from speculator_operator.render.training import Stage

SWEEP_FAILED = "SweepFailed"  # the train job's Failed reason when a sweep stage fails


def is_sweep(stage: str) -> bool:
    return stage.startswith("sweep-")


@dataclass(frozen=True)
class Assembled:
    curve: Curve | None = None  # every sweep stage reported, and the points agree
    problem: str | None = None  # they reported, but the points do not make one curve


def curve_of(reports: dict[str, StageReport], stages: list[Stage]) -> Assembled:
    """The sweep's curve once every sweep stage has reported its points (nothing before that)."""
    names = [s.name for s in stages if is_sweep(s.name)]
    parts: list[dict[str, Any]] = []
    for name in names:
        found = reports.get(name)
        part = found.sweep if found is not None else None
        if not isinstance(part, dict):
            return Assembled()
        parts.append(part)
    if not parts:
        return Assembled()
    try:
        return Assembled(curve=assemble(str(parts[0].get("device") or ""), parts))
    except SweepError as exc:
        return Assembled(problem=str(exc))


def failed_at(report: StageReport | None) -> dict[str, int] | None:
    """The point a failed sweep stage reached ({k, concurrency}), from the report its pod left."""
    part = report.sweep if report is not None else None
    where = part.get("failedAt") if isinstance(part, dict) else None
    if isinstance(where, dict) and all(isinstance(where.get(k), int) for k in ("k", "concurrency")):
        return {"k": int(where["k"]), "concurrency": int(where["concurrency"])}
    return None


def failure_words(stage: str, report: StageReport | None, fallback: str) -> str:
    """The message of a failed sweep stage: the point it reached and why, from its report, else the Job's words."""
    where = failed_at(report)
    said = report.message if report is not None and report.message else None
    if where is None or said is None:
        return f"stage {stage}: {fallback}; nothing was published"
    return f"stage {stage}: {said} (the sweep reached K={where['k']}, concurrency {where['concurrency']}); " + (
        "nothing was published"
    )
