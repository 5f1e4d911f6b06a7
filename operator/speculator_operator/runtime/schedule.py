"""When the operator acts on an object without a new event telling it to: pure rules, no clock of their own
(the caller passes `now`, a monotonic time in seconds).

- `Generations`: which `.metadata.generation` of each object was reconciled, and when one that failed is
  tried again. The operator reconciles an object the first time it sees it after starting (as kopf's
  resume did) and whenever its generation moves past the one handled; a failure is retried after its delay,
  not at the next event (a status write of its own would otherwise retry it at once).
- `Every`: a periodic job per object (a resync, an input poll, a scrape), with kopf's timer semantics:
  a first run after `initial` seconds, then every `interval` seconds, postponed while the object changed
  less than `idle` seconds ago.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Generations:
    handled: dict[str, int] = field(default_factory=dict)
    failed: dict[str, tuple[int, float]] = field(default_factory=dict)  # uid -> (generation, retry at)

    def wants(self, uid: str, generation: int, now: float) -> bool:
        """Whether `generation` of `uid` is to be reconciled now."""
        if generation <= self.handled.get(uid, 0):
            return False  # handled (an event of an older generation arriving late is not acted on either)
        failed = self.failed.get(uid)
        return failed is None or failed[0] != generation or now >= failed[1]

    def done(self, uid: str, generation: int) -> None:
        self.handled[uid] = max(generation, self.handled.get(uid, 0))
        self.failed.pop(uid, None)

    def retry(self, uid: str, generation: int, now: float, delay: float) -> None:
        self.failed[uid] = (generation, now + delay)

    def retries_due(self, now: float) -> list[str]:
        return [uid for uid, (_, at) in self.failed.items() if now >= at]

    def forget(self, uid: str) -> None:
        self.handled.pop(uid, None)
        self.failed.pop(uid, None)


@dataclass
class Every:
    interval: float
    initial: float | None = None  # the first run's delay after the object is first seen; default: interval
    idle: float = 0.0
    next_at: dict[str, float] = field(default_factory=dict)

    def due(self, key: str, now: float, changed_at: float) -> bool:
        """Whether the job runs for `key` now (and if so, its next run is scheduled from now)."""
        at = self.next_at.get(key)
        if at is None:
            self.next_at[key] = now + (self.interval if self.initial is None else self.initial)
            return False
        if now < at or now - changed_at < self.idle:
            return False
        self.next_at[key] = now + self.interval
        return True

    def forget(self, key: str) -> None:
        self.next_at.pop(key, None)
