"""A new draft earns its place on live traffic: `upgradePolicy.canary` and `status.canary` (docs/concepts/canary.md).
The rule that judges the intervals is pure and lives in planning/canary.py."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from speculator_operator.api.common import Model

PERCENT_PATTERN = r"^([1-9][0-9]?|100)%$"
CanaryState = Literal["Analyzing", "Promoting", "Promoted", "RolledBack"]
IntervalVerdict = Literal["Pass", "Fail", "Inconclusive"]


class Canary(Model):
    """Run a new draft revision (the verifier unchanged) on a few replicas beside the incumbent, compare their live
    acceptance on the same windows, and promote it or roll it back (off unless this block is set)."""

    replicas: int | str = Field(
        default=1,
        description="Replicas that run the candidate: a count, or a percentage of serving.replicas (rounded up, at "
        "least 1).",
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": f"type(self) == int ? (self >= 1 && self <= 1024) : self.matches('{PERCENT_PATTERN}')",
                    "message": "canary.replicas must be an integer in 1..1024 or a percentage such as 25%",
                }
            ],
        },
    )
    mode: Literal["Surge", "InPlace"] = Field(
        default="Surge",
        description="Surge: the canary's replicas come on top of the incumbent's (it needs spare accelerators); "
        "InPlace: the incumbent is scaled down by the canary's replicas while it runs (no extra accelerators; "
        "serving.replicas must exceed the canary's).",
    )
    interval_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="One analysis interval: both sides are compared on it. Intervals end at a scrape, so one is "
        "never shorter than the operator's scrape interval (acceptance.scrapeIntervalSeconds, 15 s by default).",
    )
    min_drafts: int = Field(
        default=200,
        ge=1,
        le=10_000_000,
        description="Drafts each side must have verified in an interval for it to count; fewer is Inconclusive, "
        "never a failure.",
    )
    metric: Literal["Alpha", "MeanAcceptedLength"] = Field(
        default="Alpha",
        description="What is compared: α (per-position acceptance at the served K) or the mean accepted length.",
    )
    margin: float = Field(
        default=0.05,
        ge=0,
        le=64,
        description="How far, in the metric's units, the candidate may fall below the incumbent in one interval "
        "and still pass.",
    )
    promote_after: int = Field(
        default=3, ge=1, le=1000, description="Passing intervals in a row (no failing one between) that promote."
    )
    rollback_after: int = Field(default=2, ge=1, le=1000, description="Failing intervals in a row that roll back.")
    max_failures: int = Field(
        default=3, ge=1, le=1000, description="Failing intervals in all that roll back, in a row or not."
    )

    def canary_replicas(self, replicas: int) -> int:
        """The candidate's replicas for `replicas` serving ones: at least 1; InPlace leaves the incumbent at least 1."""
        if isinstance(self.replicas, int):
            n = self.replicas
        else:
            n = max(1, math.ceil(replicas * int(self.replicas.rstrip("%")) / 100))
        if self.mode == "InPlace":
            n = min(n, max(1, replicas - 1))
        return n

    def incumbent_replicas(self, replicas: int) -> int:
        """The incumbent's replicas while a canary runs."""
        return replicas - self.canary_replicas(replicas) if self.mode == "InPlace" else replicas


# the spec-level rule: an InPlace canary must leave the incumbent a replica to compare against
IN_PLACE_RULE = {
    "rule": "!has(self.spec.upgradePolicy.canary) || self.spec.upgradePolicy.canary.mode != 'InPlace' || "
    "(type(self.spec.upgradePolicy.canary.replicas) == int ? "
    "self.spec.serving.replicas > self.spec.upgradePolicy.canary.replicas : self.spec.serving.replicas >= 2)",
    "message": "an InPlace canary needs serving.replicas above canary.replicas (the incumbent keeps at least one "
    "replica to compare against); use Surge for one replica",
    "fieldPath": ".spec.upgradePolicy.canary.mode",
}


class CanarySide(Model):
    """One side of the comparison over the last counted interval."""

    revision: str = Field(description="The serving revision.")
    draft_revision: str | None = Field(default=None, description="Its draft's revision.")
    replicas: int | None = Field(default=None, description="Replicas running it.")
    drafts: int | None = Field(default=None, description="Verification steps with drafts in the last interval.")
    rate: float | None = Field(default=None, description="Accepted / drafted tokens in the last interval.")
    alpha: float | None = Field(default=None, description="Per-position acceptance at the served K.")
    mean_accepted_length: float | None = Field(default=None, description="1 + accepted / drafts.")
    predicted_speedup: float | None = Field(default=None, description="E(α, K) / (1 + n·c) at the served K.")


class CanaryCounts(Model):
    """The intervals judged so far in this canary, by verdict (upgradePolicy.canary's thresholds read them)."""

    passed: int = Field(default=0, description="Intervals the candidate passed (at most margin below the incumbent).")
    failed: int = Field(default=0, description="Intervals the candidate failed; reaching maxFailures rolls it back.")
    inconclusive: int = Field(
        default=0, description="Intervals where a side verified fewer than minDrafts drafts: neither pass nor fail."
    )
    passed_in_a_row: int = Field(
        default=0,
        description="Passes since the last failure (an inconclusive one does not break it); promoteAfter promotes.",
    )
    failed_in_a_row: int = Field(
        default=0, description="Failures since the last pass; reaching rollbackAfter rolls the candidate back."
    )


class CanaryStatus(Model):
    """The canary in flight, or the last one's verdict."""

    state: CanaryState = Field(
        description="Analyzing (both sides serve), Promoting (the candidate rolls to every replica), Promoted, or "
        "RolledBack (the incumbent serves; the candidate revision is not tried again)."
    )
    candidate: CanarySide
    incumbent: CanarySide
    k: int | None = Field(default=None, description="The K both sides serve.")
    mode: Literal["Surge", "InPlace"] | None = Field(
        default=None, description="The upgradePolicy.canary.mode it runs under: Surge or InPlace."
    )
    started_at: str | None = Field(default=None, description="RFC 3339 time the canary started.")
    generation: int | None = Field(default=None, description="The spec generation the canary runs for.")
    analyzed_until: str | None = Field(
        default=None, description="The end of the last interval counted: no interval ending before it counts again."
    )
    last_interval: IntervalVerdict | None = Field(default=None, description="The last interval's verdict.")
    counts: CanaryCounts = Field(default_factory=CanaryCounts, description="Intervals judged so far, by verdict.")
    verdict: Literal["Promoted", "RolledBack"] | None = Field(
        default=None, description="Promoted or RolledBack once decided; unset while Analyzing."
    )
    verdict_at: str | None = Field(default=None, description="RFC 3339 time of the verdict.")
    message: str | None = Field(default=None, description="Why, with both sides' figures.")
