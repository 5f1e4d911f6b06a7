"""A measured throughput-versus-interactivity sweep of one draft/verifier pair on one device, and what it decides.

The evaluate stage's sweep (render/training/sweep.py, pods/sweep.py) serves the pair once per K (the evaluated K,
⌈K/2⌉ and plain decoding without a speculative config) and drives each server with closed-loop clients at
concurrencies 1, 2, 4 …; every point records the output tokens per second, vLLM's own inter-token latency (which
vLLM observes once per engine step per request, so it is the step time a request sees) and the mean number of
running requests (vLLM's batch size, which is what `num_speculative_tokens_per_batch_size` is keyed by).

`choose` turns a curve into what a deployment serves: no speculation, one static K, or a per-batch-size schedule.
A schedule is not free in vLLM 0.32: any `num_speculative_tokens_per_batch_size` turns off the scheduler's uniform
decode padding and downgrades full CUDA graphs to piecewise (vLLM issues 49548, 49986), so every range of a
schedule, its K = 0 ranges included, pays the release's schedule cost (domain/releases.py). The options are scored
by their mean throughput relative to plain decoding over the measured concurrencies (each counted once: a
log-uniform prior over the load, since the traffic's own distribution is not known), the simpler option on a tie.
docs/concepts/sweep.md explains the method and how to read a curve.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from speculator_operator.domain.economics import Schedule

PLAIN = 0  # the K of plain decoding (a server without a speculative config)
TIE = 1e-9  # relative: closer than this is a tie (the simpler option wins)


class SweepError(ValueError):
    """A curve that cannot be used: incomplete, inconsistent or malformed."""


def device_class(name: str) -> str:
    """The comparable form of a device name: `NVIDIA H100 80GB HBM3` (CUDA's name) and `NVIDIA-H100-80GB-HBM3` (the
    GPU feature discovery's node label) are both `nvidia-h100-80gb-hbm3`; the CPU is `cpu`."""
    return re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")


def concurrencies(max_concurrency: int, prompts: int) -> list[int]:
    """1, 2, 4 … up to `max_concurrency`, never above the number of prompts (a point needs one prompt per client)."""
    top = max(1, min(max_concurrency, prompts))
    out, c = [], 1
    while c <= top:
        out.append(c)
        c *= 2
    return out


@dataclass(frozen=True)
class Point:
    """One (K, concurrency) point: K = 0 is plain decoding."""

    k: int
    concurrency: int
    requests: int
    tokens: int  # output tokens the requests' completions counted
    seconds: float  # wall time from the first request sent to the last answer
    itl_ms: float | None = None  # vLLM's mean inter-token latency over the point (its step time per request)
    running: float | None = None  # mean vllm:num_requests_running while the point ran
    drafts: int | None = None
    accepted: int | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def wire(self) -> dict[str, Any]:
        out = {
            "k": self.k,
            "c": self.concurrency,
            "n": self.requests,
            "tokens": self.tokens,
            "s": round(self.seconds, 3),
            "itlMs": None if self.itl_ms is None else round(self.itl_ms, 3),
            "running": None if self.running is None else round(self.running, 2),
            "drafts": self.drafts,
            "accepted": self.accepted,
        }
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_wire(cls, row: Mapping[str, Any]) -> Point:
        try:
            point = cls(
                k=int(row["k"]),
                concurrency=int(row["c"]),
                requests=int(row["n"]),
                tokens=int(row["tokens"]),
                seconds=float(row["s"]),
                itl_ms=None if row.get("itlMs") is None else float(row["itlMs"]),
                running=None if row.get("running") is None else float(row["running"]),
                drafts=None if row.get("drafts") is None else int(row["drafts"]),
                accepted=None if row.get("accepted") is None else int(row["accepted"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SweepError(f"a sweep point is malformed ({exc!r}): {dict(row)}") from None
        if point.k < 0 or point.concurrency < 1 or point.requests < 1 or point.tokens < 0 or point.seconds <= 0:
            raise SweepError(f"a sweep point is out of range: {point.wire()}")
        return point


@dataclass(frozen=True)
class Curve:
    """Every point of one sweep: the Ks served (0: plain) × the concurrencies, on one device."""

    device: str
    ks: tuple[int, ...]  # speculative Ks, largest first; plain (0) is always measured too
    concurrencies: tuple[int, ...]
    points: tuple[Point, ...]

    def __post_init__(self) -> None:
        want = {(k, c) for k in (*self.ks, PLAIN) for c in self.concurrencies}
        have = [(p.k, p.concurrency) for p in self.points]
        if len(set(have)) != len(have):
            raise SweepError("the sweep measured a point twice")
        missing = sorted(want - set(have))
        if missing:
            raise SweepError(f"the sweep is incomplete: no point for (K, concurrency) {missing[:6]}")
        extra = sorted(set(have) - want)
        if extra:
            raise SweepError(f"the sweep has points it did not plan: {extra[:6]}")

    def at(self, k: int, concurrency: int) -> Point:
        for p in self.points:
            if p.k == k and p.concurrency == concurrency:
                return p
        raise KeyError((k, concurrency))

    def rate(self, k: int, concurrency: int) -> float:
        return self.at(k, concurrency).tokens_per_second

    def best(self, concurrency: int, k_limit: int | None = None) -> int:
        """The fastest K at a concurrency (0: plain); the smaller K on a tie (fewer draft forwards)."""
        options = [PLAIN, *sorted(k for k in self.ks if k_limit is None or k <= k_limit)]
        best = PLAIN
        for k in options:
            if self.rate(k, concurrency) > self.rate(best, concurrency) * (1 + TIE):
                best = k
        return best

    def crossover(self) -> int | None:
        """The lowest concurrency from which plain decoding is at least as fast as every K measured (None: never)."""
        for i, c in enumerate(self.concurrencies):
            if all(self.best(d) == PLAIN for d in self.concurrencies[i:]):
                return c
        return None

    def wire(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "ks": list(self.ks),
            "concurrencies": list(self.concurrencies),
            "points": [p.wire() for p in self.points],
        }

    @classmethod
    def from_wire(cls, value: Any) -> Curve:
        if not isinstance(value, Mapping):
            raise SweepError("the sweep is not an object")
        try:
            device = str(value["device"])
            ks = tuple(int(k) for k in value["ks"])
            cs = tuple(int(c) for c in value["concurrencies"])
            rows = list(value["points"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SweepError(f"the sweep is malformed ({exc!r})") from None
        if not device or not cs or any(k < 1 for k in ks) or sorted(set(cs)) != list(cs):
            raise SweepError("the sweep names no device, no concurrency, a K below 1 or unsorted concurrencies")
        return cls(device, ks, cs, tuple(Point.from_wire(r) for r in rows))

    def digest(self) -> str:
        text = json.dumps(self.wire(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def summary(self) -> dict[str, Any]:
        """What status.evaluation.sweep says: the device, the fastest K per concurrency and its speedup over plain
        decoding, the crossover and the curve's digest (the curve itself is in the published provenance)."""
        rows = []
        for c in self.concurrencies:
            k = self.best(c)
            plain = self.rate(PLAIN, c)
            row = {
                "concurrency": c,
                "bestK": k,
                "tokensPerSecond": round(self.rate(k, c), 2),
                "plainTokensPerSecond": round(plain, 2),
                "speedup": round(self.rate(k, c) / plain, 3) if plain > 0 else None,
            }
            rows.append({k: v for k, v in row.items() if v is not None})
        out = {"device": self.device, "ks": list(self.ks), "best": rows, "crossover": self.crossover(),
               "digest": self.digest()}  # fmt: skip
        return {k: v for k, v in out.items() if v is not None}  # as the API server stores it


def plain_steps(curve: Curve) -> list[tuple[float, float]]:
    """(batch, step ms) of plain decoding at each concurrency where vLLM's ITL was read: what live step times are held
    against (telemetry/acceptance.py). The batch is the measured decoding requests per step, else the concurrency."""
    out = []
    for c in curve.concurrencies:
        p = curve.at(PLAIN, c)
        if p.itl_ms:
            out.append((round(p.running if p.running else float(c), 2), round(p.itl_ms, 3)))
    return out


def assemble(device: str, parts: Iterable[Mapping[str, Any]]) -> Curve:
    """One curve from the sweep stages' reports, each `{k, points}` for one server lifetime; every report must name
    the same device."""
    points: list[Point] = []
    ks: set[int] = set()
    cs: set[int] = set()
    for part in parts:
        if device_class(str(part.get("device") or "")) != device_class(device):
            raise SweepError(f"the sweep ran on two devices: {device!r} and {part.get('device')!r}")
        for row in part.get("points") or []:
            p = Point.from_wire(row)
            points.append(p)
            cs.add(p.concurrency)
            if p.k != PLAIN:
                ks.add(p.k)
    return Curve(device_class(device), tuple(sorted(ks, reverse=True)), tuple(sorted(cs)), tuple(points))


# ------------------------------------------------------------------ from a curve to what is served


@dataclass(frozen=True)
class Choice:
    """What a curve says to serve: K = 0 and no schedule is no speculation; a schedule is rendered as
    `num_speculative_tokens_per_batch_size`. `score` is the mean throughput relative to plain decoding."""

    k: int
    schedule: Schedule | None
    score: float
    why: str


def batch_sizes(curve: Curve, max_num_seqs: int) -> list[tuple[int, int]]:
    """(concurrency, vLLM batch size) of each point that sets a batch size of its own, in order.

    A closed-loop client at concurrency c keeps c requests in the server, but vLLM's batch is the running requests:
    fewer while some are between answer and resend or waiting, and never above --max-num-seqs. The batch size of a
    concurrency is the mean `num_requests_running` its points measured (rounded; c where none was
    measured), capped at max_num_seqs. A concurrency whose batch is not above the previous one's adds nothing: vLLM
    ran the same batch there, the earlier point keeps it."""
    out: list[tuple[int, int]] = []
    for c in curve.concurrencies:
        seen = [p.running for p in curve.points if p.concurrency == c and p.running is not None]
        b = max(1, min(max_num_seqs, round(sum(seen) / len(seen)) if seen else c))
        if out and b <= out[-1][1]:
            continue
        out.append((c, b))
    return out


def _ranges(keyed: list[tuple[int, int]], max_num_seqs: int) -> Schedule:
    """[start, end, K] ranges from (batch size, K) steps: each K from its batch size to the next one's, the first
    from 1 and the last to max_num_seqs (vLLM itself carries a K on to larger batches), equal neighbours merged."""
    ranges: list[list[int]] = []
    for i, (b, k) in enumerate(keyed):
        start = 1 if i == 0 else b
        end = keyed[i + 1][0] - 1 if i + 1 < len(keyed) else max_num_seqs
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
    return Schedule(tuple((s, e, k) for s, e, k in ranges))


def choose(curve: Curve, max_num_seqs: int, k_limit: int, schedule_cost: float) -> Choice:
    """The fastest of: no speculation, each static K ≤ k_limit, and the per-batch-size schedule of the best K at
    each measured batch size (every range of which pays `schedule_cost`, a fraction of its throughput)."""
    if not 0 <= schedule_cost < 1:
        raise ValueError(f"the schedule cost must be in [0, 1), got {schedule_cost}")
    sizes = batch_sizes(curve, max_num_seqs)
    if not sizes:
        raise SweepError("the sweep has no concurrency")
    plain = {c: curve.rate(PLAIN, c) for c, _ in sizes}
    if any(v <= 0 for v in plain.values()):
        raise SweepError("plain decoding produced no tokens at some concurrency")

    def relative(rates: Mapping[int, float]) -> float:
        return sum(rates[c] / plain[c] for c, _ in sizes) / len(sizes)

    best = Choice(PLAIN, None, 1.0, "plain decoding is at least as fast as every measured K at every concurrency")
    for k in sorted(k for k in curve.ks if k <= k_limit):
        score = relative({c: curve.rate(k, c) for c, _ in sizes})
        if score > best.score * (1 + TIE):
            best = Choice(k, None, score, f"K={k} at every batch size")
    keyed = [(b, curve.best(c, k_limit)) for c, b in sizes]
    if len({k for _, k in keyed}) > 1:
        kept = 1.0 - schedule_cost
        score = relative({c: curve.rate(curve.best(c, k_limit), c) * kept for c, _ in sizes})
        if score > best.score * (1 + TIE):
            top = max(k for _, k in keyed)
            best = Choice(top, _ranges(keyed, max_num_seqs), score, "the fastest K at each measured batch size")
    return best
