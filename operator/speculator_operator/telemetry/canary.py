"""A canary's analysis intervals as the scraper measures them (docs/concepts/canary.md): when an interval begins,
when it ends, and both sides' figures from the same increments. Pure: the scrape job keeps one per object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speculator_operator.api.deployment import Acceptance, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.telemetry.acceptance import Economics, acceptance_status
from speculator_operator.telemetry.vllm_metrics import Window


@dataclass(frozen=True)
class Measured:
    """One analysis interval as the scraper measured it: its wall-clock bounds and both sides' figures."""

    start: str
    end: str
    candidate: Acceptance
    incumbent: Acceptance


@dataclass
class Analysis:
    """A canary's interval window: both revisions' pods scraped from `since`, judged every intervalSeconds."""

    candidate: str
    incumbent: str
    window: Window
    since: float  # monotonic
    since_at: str  # the same moment, wall clock (what status.canary.analyzedUntil is compared with)

    def measure(self, spec: SpeculatorDeploymentSpec, econ: Economics, now: float, at: str) -> Measured | None:
        """The interval's figures once it has run for intervalSeconds (then the next begins), else None."""
        policy = spec.upgrade_policy.canary
        if policy is None or now - self.since < policy.interval_seconds:
            return None
        sides = [
            acceptance_status(self.window.totals(rev, now), econ, revision=rev, observed_at=at,
                              min_samples=policy.min_drafts)
            for rev in (self.candidate, self.incumbent)
        ]  # fmt: skip
        measured = Measured(self.since_at, at, sides[0], sides[1])
        self.window.drain()
        self.since, self.since_at = now, at
        return measured


def analysis_now(
    found: Analysis | None,
    status: SpeculatorDeploymentStatus,
    spec: SpeculatorDeploymentSpec,
    now: float,
    at: str,
    revisions: set[Any],
    scrape_interval: float,
) -> Analysis | None:
    """The analysis of the canary in `status` at a scrape (`now` monotonic, `at` wall clock): `found` going on,
    or a new one for a new candidate (and after a restart: its first interval starts now, after whatever
    status.canary counted last); None when no canary is analysed. A new one begins only once a ready pod of the
    candidate is scraped (`revisions`: those of the ready pods): the minutes a candidate's server takes to start
    would make the first interval Inconclusive, one interval later to a verdict."""
    canary, policy = status.canary, spec.upgrade_policy.canary
    if canary is None or canary.state != "Analyzing" or policy is None:
        return None
    sides = (canary.candidate.revision, canary.incumbent.revision)
    if found is not None and (found.candidate, found.incumbent) == sides:
        return found
    if canary.candidate.revision not in revisions:
        return None
    return Analysis(*sides, Window(2.0 * policy.interval_seconds + scrape_interval), now, at)
