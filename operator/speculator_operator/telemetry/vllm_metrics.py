"""vLLM's Prometheus metrics as the scrape reads them (docs/reference/vllm.md §5): one scrape's counters of one pod
(`parse_sample`, by prometheus_client's own parser), and per-pod increments over a sliding window (`Window`).
Pure: controllers/telemetry.py fetches the text and keeps the windows; the evaluate pod reuses the same reading.

- the counters are summed over vLLM's engines (and model names), the per-position counter by position;
- a counter below its last value means the pod restarted: its new value is the increase (Prometheus's rule);
- a window counts only the pods of the revision asked for, and says how many it left out and which failed.
What the figures say (status.acceptance, SpeculationEffective) is telemetry/acceptance.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATED = "vllm:generation_tokens"
RUNNING = "vllm:num_requests_running"
# vLLM observes the inter-token latency once per engine step per request (so its mean is a request's step time), and
# the tokens per engine step once per step (its count: the steps)
ITL = "vllm:inter_token_latency_seconds"
STEPS = "vllm:iteration_tokens_total"


class MetricsError(Exception):
    """A pod's metrics could not be used: `reason` is a CamelCase word for the status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Sample:
    """One scrape of one pod: counters summed over vLLM's engines (and model names), the running gauge."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()
    generated: float = 0.0
    running: float = 0.0
    itl_sum: float = 0.0  # seconds
    itl_count: float = 0.0  # request-steps
    steps: float = 0.0  # engine steps

    def counters(self) -> tuple[float, ...]:
        return (self.drafts, self.draft_tokens, self.accepted, self.generated, self.itl_sum, self.itl_count,
                self.steps, *self.per_position)  # fmt: skip


# the sample names read: counters by their `_total` series (prometheus_client's exposition interleaves
# `_total` and `_created` per label set, so its parser may split one counter into several families)
SERIES = {
    f"{DRAFTS}_total",
    f"{DRAFT_TOKENS}_total",
    f"{ACCEPTED}_total",
    f"{PER_POSITION}_total",
    f"{GENERATED}_total",
    RUNNING,
    f"{ITL}_sum",
    f"{ITL}_count",
    f"{STEPS}_count",
}


def parse_sample(text: str) -> Sample:
    """vLLM's /metrics text, parsed by prometheus_client's own parser; series summed over their labels
    (engines, model names), per-position counters by position."""
    sums: dict[str, float] = {}
    positions: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in SERIES:
                    continue
                value = float(s.value)
                if not math.isfinite(value) or value < 0:
                    raise MetricsError("Unparseable", f"{s.name} has the value {s.value}")
                if s.name == f"{PER_POSITION}_total":
                    try:
                        position = int(s.labels.get("position", ""))
                    except ValueError:
                        raise MetricsError(
                            "Unparseable", f"{s.name} has position {s.labels.get('position')!r}"
                        ) from None
                    if not 0 <= position < 1024:
                        raise MetricsError("Unparseable", f"{s.name} has position {position}")
                    positions[position] = positions.get(position, 0.0) + value
                else:
                    sums[s.name] = sums.get(s.name, 0.0) + value
    except MetricsError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise MetricsError("Unparseable", f"not Prometheus text: {str(exc)[:200]}") from None
    if not {f"{DRAFTS}_total", f"{DRAFT_TOKENS}_total", f"{ACCEPTED}_total"} <= set(sums):
        raise MetricsError(
            "NoSpecDecodeMetrics",
            "no vllm:spec_decode_* counters (the draft not loaded, or --disable-log-stats set)",
        )
    per_position = tuple(positions.get(p, 0.0) for p in range(max(positions) + 1)) if positions else ()
    return Sample(
        drafts=sums[f"{DRAFTS}_total"],
        draft_tokens=sums[f"{DRAFT_TOKENS}_total"],
        accepted=sums[f"{ACCEPTED}_total"],
        per_position=per_position,
        generated=sums.get(f"{GENERATED}_total", 0.0),
        running=sums.get(RUNNING, 0.0),
        itl_sum=sums.get(f"{ITL}_sum", 0.0),
        itl_count=sums.get(f"{ITL}_count", 0.0),
        steps=sums.get(f"{STEPS}_count", 0.0),
    )


@dataclass(frozen=True)
class Increment:
    """What one pod's counters grew by between two scrapes, `since` and `at` (and its load at the second)."""

    since: float
    at: float
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]
    generated: float
    running: float
    itl_sum: float = 0.0
    itl_count: float = 0.0
    steps: float = 0.0


def increment(prev: Sample, cur: Sample, since: float, at: float) -> tuple[Increment, bool]:
    """cur − prev, and whether the counters were reset (then cur itself is the increase)."""
    reset = any(c < p for c, p in zip(cur.counters(), prev.counters(), strict=False)) or len(cur.per_position) < len(
        prev.per_position
    )
    base = Sample() if reset else prev
    positions = tuple(
        c - (base.per_position[i] if i < len(base.per_position) else 0.0) for i, c in enumerate(cur.per_position)
    )
    inc = Increment(
        since=since,
        at=at,
        drafts=cur.drafts - base.drafts,
        draft_tokens=cur.draft_tokens - base.draft_tokens,
        accepted=cur.accepted - base.accepted,
        per_position=positions,
        generated=cur.generated - base.generated,
        running=cur.running,
        itl_sum=cur.itl_sum - base.itl_sum,
        itl_count=cur.itl_count - base.itl_count,
        steps=cur.steps - base.steps,
    )
    return inc, reset


@dataclass
class PodTrack:
    revision: str | None
    last: Sample | None = None
    last_at: float = 0.0
    increments: deque[Increment] = field(default_factory=deque)
    resets: int = 0
    error: tuple[str, str] | None = None  # (reason, message) of the last scrape, when it failed


@dataclass
class Totals:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: list[float] = field(default_factory=list)
    generated: float = 0.0
    running: float = 0.0  # the summed latest load of the pods counted
    itl_sum: float = 0.0
    itl_count: float = 0.0
    steps: float = 0.0
    span: float = 0.0  # seconds the increments cover
    counted: int = 0  # pods of the served revision that answered
    resets: int = 0
    other_revision: int = 0
    failing: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod -> (reason, message)


class Window:
    """Per-pod increments over the last `seconds` (kept in memory: an operator restart starts afresh,
    and says so through `NotEnoughSamples` until the window has filled again)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.pods: dict[str, PodTrack] = {}

    def observe(self, pod: str, revision: str | None, sample: Sample, at: float) -> None:
        track = self.pods.get(pod)
        if track is None or track.revision != revision:
            track = self.pods[pod] = PodTrack(revision)
        if track.last is not None:
            inc, reset = increment(track.last, sample, track.last_at, at)
            track.increments.append(inc)
            track.resets += int(reset)
        track.last, track.last_at, track.error = sample, at, None
        self._trim(track, at)

    def failed(self, pod: str, revision: str | None, reason: str, message: str, at: float) -> None:
        track = self.pods.get(pod)
        if track is None or track.revision != revision:
            track = self.pods[pod] = PodTrack(revision)
        track.error = (reason, message)
        self._trim(track, at)

    def drain(self) -> None:
        """Forget every increment, keeping each pod's last sample: the next interval counts from here, and no
        increment is counted in two intervals."""
        for track in self.pods.values():
            track.increments.clear()

    def keep_only(self, pods: set[str]) -> None:
        for gone in set(self.pods) - pods:
            del self.pods[gone]

    def _trim(self, track: PodTrack, now: float) -> None:
        while track.increments and track.increments[0].at < now - self.seconds:
            track.increments.popleft()

    def totals(self, revision: str | None, now: float) -> Totals:
        out = Totals()
        earliest = now
        for name, track in sorted(self.pods.items()):
            if track.error is not None:
                out.failing[name] = track.error
                continue
            if track.revision != revision:
                out.other_revision += 1
                continue
            self._trim(track, now)
            out.counted += 1
            out.resets += track.resets
            if track.last is not None:
                out.running += track.last.running
            for inc in track.increments:
                out.drafts += inc.drafts
                out.draft_tokens += inc.draft_tokens
                out.accepted += inc.accepted
                out.generated += inc.generated
                out.itl_sum += inc.itl_sum
                out.itl_count += inc.itl_count
                out.steps += inc.steps
                for i, v in enumerate(inc.per_position):
                    if i >= len(out.per_position):
                        out.per_position.append(0.0)
                    out.per_position[i] += v
            if track.increments:
                earliest = min(earliest, track.increments[0].since)
        out.span = max(0.0, now - earliest)
        return out
