"""A work queue with controller-runtime's semantics, for one pass per object at a time.

Every trigger (an event of the object or of a child, a due poll or resync, a scrape whose result moved, a
tuning decision, a publish, a drift) only *adds the object's key with its cause*. The queue then promises:

- a key is processed by at most one worker at a time;
- keys added while their pass runs coalesce into exactly one more pass, which gets every cause added meanwhile;
- a pass that raises, or asks for it, is retried after a per-key back-off that doubles from `base_delay` up to
  `max_delay`, and is reset by the key's next pass that succeeds (controller-runtime's per-item exponential
  rate limiter, `workqueue.DefaultTypedItemBasedRateLimiter`);
- a pass that raises `Terminal` (an error no retry can mend: the operator's own bug) is not retried: the queue
  tells `terminal(key, error)` on the pass's own worker, before the key can be taken again, so that the key's
  controller says so (a condition, an event) within the one-pass-per-key rule; its back-off is reset, and the
  key's next add runs a pass as usual (controller-runtime's `reconcile.TerminalError`);
- a pass that asks to run again after a delay (`Result.after`: a poll that is due later) is added back then,
  without back-off;
- a key has at most one delayed add pending (`add_after`, a retry, a `Result.after`): another keeps the earlier
  deadline and gathers its cause too, so the pass that fires gets every cause (and the lane they make), and
  `forget` cancels it (controller-runtime's delaying queue: an item waits once, for its earliest time);
- a key whose gathered causes are all quick ones (`quick(causes)`: a child's readiness, say) is taken before
  the others, and `quick_workers` workers take only such keys: a burst of slow passes (audits of a thousand new
  objects) never makes a child's event wait behind it. A quick key that is given a slow cause joins the others;
- within each of the two, a key added with a higher `priority` is taken first, then in order of arrival; a key
  added again with a higher priority than it has moves up (controller-runtime's `priorityqueue`, `AddWithOpts`
  with `Priority`): among a thousand objects' quick passes, the one that makes an object Ready is not the last.

Why it is built so (docs/design/runtime.md): the controllers' passes read, plan, apply children and write
status; two passes of one object at once, from copies of different ages, could apply an older revision over a
newer one. controller-runtime (`pkg/internal/controller/controller.go`) makes that impossible by structure with
one queue, a dirty set and a processing set; this is the same in Python threads, because the passes block on
the API server and the checkpoint sources. Pure of Kubernetes: the keys and the handler are the caller's.

Each pass runs with a pass id (`current_pass()`: the key's label and the queue's count of passes taken), which
`log_pass_ids()` puts in every log line written during the pass, on whichever logger: the lines of one pass can be
told from those of the pass before (docs/operations/troubleshooting.md).
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)

_PASS: contextvars.ContextVar[str | None] = contextvars.ContextVar("speculator_pass", default=None)


def current_pass() -> str | None:
    """The id of the pass running on this thread (None outside a pass)."""
    return _PASS.get()


_installed = threading.Lock()
_factory: Callable[..., logging.LogRecord] | None = None


def log_pass_ids() -> None:
    """From now on, every log record made during a pass, on any logger, starts with `pass=<id>` and carries the id
    as `record.pass_id` (None outside a pass) for a formatter that places it itself. Done where records are made
    (the record factory), not by a filter: a logger's filter sees only the records of that logger itself, not of
    its children, and a handler's only what reaches that handler. Installed once; again does nothing."""
    global _factory
    with _installed:
        if _factory is not None:
            return
        previous = logging.getLogRecordFactory()

        def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            pass_id = _PASS.get()
            record.pass_id = pass_id
            if pass_id is not None:
                record.msg = f"pass={pass_id} {record.msg}"
            return record

        _factory = make
        logging.setLogRecordFactory(make)


class Terminal(Exception):
    """A pass failed in a way no retry mends (a status its model refuses: a bug of the operator's): not retried;
    the queue's `terminal` callback is told. `error` is what was raised."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


@dataclass(frozen=True)
class Result:
    """What a pass asks for: nothing more (the default), a retry with back-off, or a pass after `after` s."""

    retry: bool = False
    after: float | None = None
    cause: str = "requeue"  # the cause the pass after `after` gets


DONE = Result()


class _Lane(Generic[K]):
    """Ready keys by priority (highest first), each priority in order of arrival."""

    def __init__(self) -> None:
        self._keys: dict[int, deque[K]] = {}
        self._priority: dict[K, int] = {}

    def push(self, key: K, priority: int) -> None:
        self._priority[key] = priority
        self._keys.setdefault(priority, deque()).append(key)

    def remove(self, key: K) -> None:
        self._keys[self._priority.pop(key)].remove(key)

    def pop(self) -> K:
        key = self._keys[max(p for p, keys in self._keys.items() if keys)].popleft()
        del self._priority[key]
        return key

    def priority(self, key: K) -> int | None:
        """The key's priority here (None: not here)."""
        return self._priority.get(key)

    def __len__(self) -> int:
        return len(self._priority)


@dataclass(order=True)
class _Timer(Generic[K]):
    """An entry of the timers' heap; stale once its key's pending add is due earlier, fired or forgotten."""

    due: float
    seq: int
    key: K = field(compare=False)


@dataclass
class _Delayed:
    """A key's one pending delayed add: when (the earliest asked for), with which causes (all of them)."""

    due: float
    seq: int
    causes: set[str]


class WorkQueue(Generic[K]):
    """`handler(key, causes) -> Result` runs on `workers` threads, one pass per key at a time."""

    def __init__(
        self,
        handler: Callable[[K, frozenset[str]], Result],
        workers: int = 4,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        name: str = "workqueue",
        waited: Callable[[float, bool], None] | None = None,
        quick: Callable[[frozenset[str]], bool] | None = None,
        quick_workers: int = 0,
        terminal: Callable[[K, Terminal], None] | None = None,
        label: Callable[[K], str] = str,
    ) -> None:
        """`waited(seconds, quick)` is told, as each pass starts, how long its key waited in the queue for a worker,
        and whether it was taken as a quick key. `terminal(key, error)` is told of a pass that raised `Terminal`,
        on its worker. `label(key)` names the key in its passes' ids."""
        self._handler, self._base, self._max, self._clock = handler, base_delay, max_delay, clock
        self._quick = quick
        self._urgent: _Lane[K] = _Lane()  # ready keys whose causes are all quick
        self._waited = waited
        self._since: dict[K, float] = {}  # queued keys -> when they became ready
        self._lock = threading.Condition()
        self._queue: _Lane[K] = _Lane()  # the other ready keys
        self._causes: dict[K, set[str]] = {}  # queued or dirty keys -> the causes gathered for their next pass
        self._priority: dict[K, int] = {}  # queued or dirty keys -> the highest priority they were added with
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}  # consecutive failed passes per key: the back-off's exponent
        self._timers: list[_Timer[K]] = []  # a heap; an entry is live while it is its key's `_delayed` one
        self._delayed: dict[K, _Delayed] = {}  # keys with a delayed add pending -> when, and its causes
        self._terminal, self._label = terminal, label
        self._taken = itertools.count(1)  # numbers the passes, for their ids
        self._seq = 0
        self._stopped = False
        self.passes = 0  # passes run, for a passes_total metric
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        self._threads += [
            threading.Thread(target=self._work, args=(True,), name=f"{name}-quick-{i}", daemon=True)
            for i in range(quick_workers if quick is not None else 0)
        ]
        self._threads.append(threading.Thread(target=self._tick, name=f"{name}-timers", daemon=True))
        for thread in self._threads:
            thread.start()

    # ---- triggers ----------------------------------------------------------------------------------------

    def add(self, key: K, cause: str, priority: int = 0) -> None:
        """Ask for a pass of `key` because of `cause`: queued, merged into a queued one, or one more after the
        running one; taken before the keys of a lower `priority` in its lane."""
        with self._lock:
            if self._stopped:
                return
            pending = self._causes.get(key)
            if pending is not None:
                pending.add(cause)  # queued, or dirty behind its running pass: it will be seen
                raised = priority > self._priority.get(key, 0)
                if raised:
                    self._priority[key] = priority
                lane = self._urgent if self._urgent.priority(key) is not None else self._queue
                slowed = lane is self._urgent and not self._is_quick(pending)
                if lane.priority(key) is not None and (raised or slowed):
                    lane.remove(key)  # a slow cause now: it waits with the others; or it moves up in its lane
                    self._push(key)
                return
            self._causes[key] = {cause}
            self._priority[key] = priority
            if key not in self._processing:
                self._ready(key)

    def _is_quick(self, causes: set[str] | frozenset[str]) -> bool:
        return self._quick is not None and self._quick(frozenset(causes))

    def _push(self, key: K) -> None:
        lane = self._urgent if self._is_quick(self._causes.get(key, set())) else self._queue
        lane.push(key, self._priority.get(key, 0))

    def _ready(self, key: K) -> None:
        self._push(key)
        self._since[key] = self._clock()
        self._lock.notify_all()

    def add_after(self, key: K, cause: str, delay: float) -> None:
        """`add(key, cause)` in `delay` seconds; if the key already waits for a delayed add, the earlier of the two
        deadlines is kept, and the add then carries both causes."""
        with self._lock:
            self._delay(key, cause, delay)

    def _delay(self, key: K, cause: str, delay: float) -> None:
        due = self._clock() + max(delay, 0.0)
        pending = self._delayed.get(key)
        if pending is not None:
            pending.causes.add(cause)
            if pending.due <= due:
                return
            pending.due = due  # sooner: a new heap entry, the old one is left stale
        else:
            pending = self._delayed[key] = _Delayed(due, 0, {cause})
        self._seq += 1
        pending.seq = self._seq
        heapq.heappush(self._timers, _Timer(due, self._seq, key))
        self._lock.notify_all()

    def forget(self, key: K) -> None:
        """Drop what is kept about `key` once its object is gone: its failures, and its pending delayed add."""
        with self._lock:
            self._failures.pop(key, None)
            if self._delayed.pop(key, None) is not None:
                self._lock.notify_all()  # wait_idle may be waiting on it

    def delayed(self, key: K) -> tuple[float, frozenset[str]] | None:
        """The key's pending delayed add: in how many seconds, with which causes (None: none)."""
        with self._lock:
            pending = self._delayed.get(key)
            return None if pending is None else (pending.due - self._clock(), frozenset(pending.causes))

    def backoff(self, key: K) -> float:
        """The delay before the next retry of `key`: base · 2^(failures-1), capped."""
        with self._lock:
            failures = self._failures.get(key, 0)
        return float(min(self._base * 2 ** max(failures - 1, 0), self._max))

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no key is queued or in a pass and no retry or requeue is pending (False: timed out)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._urgent or self._processing or self._delayed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def pending(self, key: K) -> frozenset[str]:
        """The causes gathered for `key`'s next pass (empty: none is asked for)."""
        with self._lock:
            return frozenset(self._causes.get(key, ()))

    def processing(self, key: K) -> bool:
        """Whether a pass of `key` is running now."""
        with self._lock:
            return key in self._processing

    def depth(self) -> int:
        with self._lock:
            return len(self._queue) + len(self._urgent)

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    # ---- workers -----------------------------------------------------------------------------------------

    def _take(self, quick_only: bool = False) -> tuple[K, frozenset[str], str] | None:
        with self._lock:
            while not self._urgent and (quick_only or not self._queue) and not self._stopped:
                self._lock.wait()
            if self._stopped:
                return None
            quick = bool(self._urgent)
            key = self._urgent.pop() if quick else self._queue.pop()
            self._priority.pop(key, None)
            self._processing.add(key)
            since = self._since.pop(key, None)
            causes = frozenset(self._causes.pop(key, set()))
            pass_id = f"{self._label(key)}#{next(self._taken)}"
        if self._waited is not None and since is not None:
            self._waited(self._clock() - since, quick)
        return key, causes, pass_id

    def _work(self, quick_only: bool = False) -> None:
        while (taken := self._take(quick_only)) is not None:
            key, causes, pass_id = taken
            token = _PASS.set(pass_id)
            try:
                result = self._handler(key, causes)
            except Terminal as exc:  # not retried: the key's controller says so, still within this pass
                result = DONE if self._told(key, exc) else Result(retry=True)
            except Exception:  # a pass that raises is retried with back-off; the handler logs its own errors
                result = Result(retry=True)
            finally:
                _PASS.reset(token)
            self._done(key, result)

    def _told(self, key: K, error: Terminal) -> bool:
        """Whether the key's controller was told (if it could not say so, the API server away, the pass is
        retried, and says so then)."""
        if self._terminal is None:
            return True
        try:
            self._terminal(key, error)
        except Exception:
            log.exception("%s: the terminal error could not be reported; retried", self._label(key))
            return False
        return True

    def _done(self, key: K, result: Result) -> None:
        with self._lock:
            self.passes += 1
            self._processing.discard(key)
            if result.retry:
                self._failures[key] = self._failures.get(key, 0) + 1
                self._delay(key, "retry", min(self._base * 2 ** (self._failures[key] - 1), self._max))
            else:
                self._failures.pop(key, None)
                if result.after is not None:
                    self._delay(key, result.cause, result.after)
            if key in self._causes:  # added while it ran: exactly one more pass, now
                self._ready(key)
            self._lock.notify_all()

    def _tick(self) -> None:
        with self._lock:
            while not self._stopped:
                now = self._clock()
                due: list[tuple[K, set[str]]] = []
                while self._timers and self._timers[0].due <= now:
                    timer = heapq.heappop(self._timers)
                    pending = self._delayed.get(timer.key)
                    if pending is not None and pending.seq == timer.seq:  # else stale: sooner, fired or forgotten
                        del self._delayed[timer.key]
                        due.append((timer.key, pending.causes))
                for key, causes in due:  # under the same hold of the lock (reentrant): never idle in between
                    for cause in sorted(causes):
                        self.add(key, cause)
                if due:
                    continue
                wait = self._timers[0].due - now if self._timers else None
                self._lock.wait(timeout=None if wait is None else min(wait, 1.0))
