"""The work queue's promises (runtime/workqueue.py): one pass per key at a time, triggers during a pass coalesce
into exactly one more, failures retry with a capped, doubling back-off that success resets, a terminal failure is
not retried but told to the key's controller within the pass, a pass may ask for another later, a key waits for at
most one delayed add (the earliest, with every cause), and each pass's log lines carry its id. Every wait below is
on a condition; the timeouts only bound a failing test."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import pytest

from speculator_operator.runtime.workqueue import DONE, Result, Terminal, WorkQueue, current_pass, log_pass_ids

from ..waiting import eventually

LIMIT = 10.0  # seconds a failing test may hang before it fails
Handler = Callable[[str, frozenset[str]], Result]
T = TypeVar("T")


def settled(queue: WorkQueue[str], key: str) -> float:
    """Trigger `key` once, wait until the queue is idle, shut it down; the key's back-off then."""
    try:
        queue.add(key, "created")
        assert queue.wait_idle(LIMIT)
        return queue.backoff(key)
    finally:
        queue.shutdown()


def test_triggers_during_a_pass_coalesce_into_exactly_one_more_with_all_their_causes() -> None:
    started, release = threading.Event(), threading.Event()
    passes: list[frozenset[str]] = []
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    lock = threading.Lock()

    def handler(key: str, causes: frozenset[str]) -> Result:
        with lock:
            running[key] += 1
            most[key] = max(most[key], running[key])
            passes.append(causes)
            first = len(passes) == 1
        if first:
            started.set()
            assert release.wait(LIMIT)
        with lock:
            running[key] -= 1
        return DONE

    queue: WorkQueue[str] = WorkQueue(handler, workers=4)
    try:
        queue.add("ns/a", "created")
        assert started.wait(LIMIT)
        for cause in ("child", "poll", "drift", "child"):
            queue.add("ns/a", cause)  # four idle workers, yet none may take the key while its pass runs
        assert queue.depth() == 0
        release.set()
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert passes == [frozenset({"created"}), frozenset({"child", "poll", "drift"})]
    assert most["ns/a"] == 1
    assert queue.passes == 2


def test_different_keys_run_at_the_same_time() -> None:
    barrier = threading.Barrier(2, timeout=LIMIT)
    met: list[str] = []

    def handler(key: str, causes: frozenset[str]) -> Result:
        barrier.wait()  # each pass waits for the other key's: only concurrent passes get through
        met.append(key)
        return DONE

    queue: WorkQueue[str] = WorkQueue(handler, workers=2)
    try:
        queue.add("a", "x")
        queue.add("b", "x")
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert sorted(met) == ["a", "b"]


def test_failures_back_off_doubling_to_the_cap_and_success_resets_it() -> None:
    seen: list[tuple[frozenset[str], float]] = []
    queues: list[WorkQueue[str]] = []

    def handler(key: str, causes: frozenset[str]) -> Result:
        seen.append((causes, queues[0].backoff(key)))
        if len(seen) <= 4:
            raise RuntimeError("the API server said 500")
        return DONE

    queues.append(WorkQueue(handler, workers=1, base_delay=0.001, max_delay=0.004))
    after_success = settled(queues[0], "k")
    assert [c for c, _ in seen] == [frozenset({"created"})] + [frozenset({"retry"})] * 4
    # the back-off in force when each pass began: none yet, then 1, 2, 4 ms, then capped at 4
    assert [b for _, b in seen] == [0.001, 0.001, 0.002, 0.004, 0.004]
    assert after_success == 0.001


def test_a_pass_may_ask_for_another_later_without_back_off() -> None:
    causes: list[frozenset[str]] = []

    def handler(key: str, c: frozenset[str]) -> Result:
        causes.append(c)
        return Result(after=0.001) if len(causes) == 1 else DONE

    backoff = settled(WorkQueue(handler, workers=1), "k")
    assert causes == [frozenset({"created"}), frozenset({"requeue"})]
    assert backoff == 1.0  # the default base: no failure counted


def test_after_shutdown_nothing_runs() -> None:
    ran: list[str] = []

    def handler(key: str, c: frozenset[str]) -> Result:
        ran.append(key)
        return DONE

    queue: WorkQueue[str] = WorkQueue(handler, workers=2)
    queue.shutdown()
    queue.add("k", "late")
    assert ran == []
    assert queue.depth() == 0


QUICK = frozenset({"child"})


def ordered(
    quick_workers: int, done: threading.Event | None = None
) -> tuple[WorkQueue[str], list[str], threading.Event, threading.Event]:
    """A queue whose first pass (key s1) holds its worker until released; the keys' order of passes (`done` is
    set when key q has had its pass)."""
    order: list[str] = []
    started, release = threading.Event(), threading.Event()

    def handler(key: str, causes: frozenset[str]) -> Result:
        order.append(key)
        if key == "s1":
            started.set()
            assert release.wait(LIMIT)
        if key == "q" and done is not None:
            done.set()
        return DONE

    queue: WorkQueue[str] = WorkQueue(
        handler,
        workers=1,
        quick=lambda causes: causes <= QUICK,
        quick_workers=quick_workers,
        waited=lambda _, quick: taken.append(quick),
    )
    return queue, order, started, release


taken: list[bool] = []  # whether each pass of `ordered`'s queue was taken as a quick key, in order


def test_a_quick_key_is_taken_before_slow_ones_that_arrived_earlier() -> None:
    queue, order, started, release = ordered(quick_workers=0)
    try:
        queue.add("s1", "spec")
        assert started.wait(LIMIT)
        queue.add("s2", "spec")
        queue.add("k", "child")
        queue.add("k", "spec")  # a slow cause too: k waits with the others now
        queue.add("q", "child")
        taken.clear()
        release.set()
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert order == ["s1", "q", "s2", "k"]
    assert taken == [True, False, False]  # each wait is told whether its key was taken as a quick one


def test_quick_workers_serve_quick_keys_while_every_other_worker_is_held() -> None:
    done = threading.Event()
    queue, order, started, release = ordered(quick_workers=1, done=done)
    try:
        queue.add("s1", "spec")
        assert started.wait(LIMIT)
        queue.add("s2", "spec")
        queue.add("q", "child")
        assert done.wait(LIMIT)  # served while s1 holds the only other worker and s2 waits
        assert order == ["s1", "q"]
    finally:
        release.set()
        assert queue.wait_idle(LIMIT)
        queue.shutdown()
    assert order == ["s1", "q", "s2"]


def test_a_higher_priority_is_taken_first_in_its_lane_and_a_key_added_again_higher_moves_up() -> None:
    queue, order, started, release = ordered(quick_workers=0)
    try:
        queue.add("s1", "spec")
        assert started.wait(LIMIT)
        queue.add("a", "child")
        queue.add("b", "child")
        queue.add("r", "child", priority=1)  # arrived last, taken first among the quick keys
        queue.add("b", "child", priority=1)  # added again higher: ahead of a, behind r (which came first)
        queue.add("a", "child", priority=0)  # added again lower: keeps its place
        queue.add("s2", "spec", priority=1)  # a slow key's priority orders only the slow ones
        queue.add("s3", "spec", priority=2)
        release.set()
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert order == ["s1", "r", "b", "a", "s3", "s2"]


def test_a_priority_given_during_a_pass_orders_the_one_more_pass() -> None:
    queue, order, started, release = ordered(quick_workers=0)
    try:
        queue.add("s1", "child")
        assert started.wait(LIMIT)
        queue.add("a", "child")
        queue.add("s1", "child", priority=1)  # dirty behind its running pass: its next one goes first
        release.set()
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert order == ["s1", "s1", "a"]


def until(check: Callable[[], T]) -> T:
    """`check()`'s value once it stops raising AssertionError (within LIMIT)."""
    return eventually(check, LIMIT, 0.005)


def _with(pending: tuple[float, frozenset[str]] | None, cause: str) -> tuple[float, frozenset[str]]:
    assert pending is not None
    assert cause in pending[1], pending
    return pending


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delayed_adds_of_a_key_keep_the_earliest_deadline_and_every_cause() -> None:
    clock = Clock()
    ran: list[frozenset[str]] = []
    done = threading.Event()
    lanes: list[bool] = []

    def handler(key: str, causes: frozenset[str]) -> Result:
        ran.append(causes)
        done.set()
        return DONE

    queue: WorkQueue[str] = WorkQueue(
        handler, workers=1, clock=clock, quick=lambda c: c <= QUICK, quick_workers=1,
        waited=lambda _, quick: lanes.append(quick),
    )  # fmt: skip
    try:
        queue.add_after("k", "poll", 60)
        queue.add_after("k", "child", 5)  # sooner: this deadline, both causes
        queue.add_after("k", "resync", 30)  # later: the deadline stays, the cause joins
        pending = queue.delayed("k")
        assert pending is not None
        assert pending[0] == pytest.approx(5)
        assert pending[1] == {"poll", "child", "resync"}
        clock.now += 5
        assert done.wait(LIMIT)
        assert queue.wait_idle(LIMIT)
        assert queue.delayed("k") is None
    finally:
        queue.shutdown()
    assert ran == [frozenset({"poll", "child", "resync"})]  # one pass, with every cause
    assert lanes == [False]  # a slow cause among them: not a quick key
    assert queue.passes == 1


def test_a_quick_delayed_add_stays_quick_and_a_retry_joins_a_pending_delayed_add() -> None:
    clock = Clock()
    ran: list[frozenset[str]] = []
    lanes: list[bool] = []
    first = threading.Event()

    def handler(key: str, causes: frozenset[str]) -> Result:
        ran.append(causes)
        first.set()
        if len(ran) == 1:
            raise RuntimeError("the API server said 500")  # a retry in base_delay (10 s) joins the child's add
        return DONE

    queue: WorkQueue[str] = WorkQueue(
        handler, workers=1, clock=clock, base_delay=10, quick=lambda c: c <= QUICK, quick_workers=1,
        waited=lambda _, quick: lanes.append(quick),
    )  # fmt: skip
    try:
        queue.add("k", "spec")
        assert first.wait(LIMIT)
        queue.add_after("k", "child", 20)
        pending = until(lambda: _with(queue.delayed("k"), "retry"))  # once the failed pass has ended
        assert pending[1] == {"child", "retry"}
        assert pending[0] == pytest.approx(10)  # the retry's deadline, the earlier
        clock.now += 10
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert ran == [frozenset({"spec"}), frozenset({"child", "retry"})]
    assert lanes == [False, False]


def test_forget_cancels_the_keys_delayed_add() -> None:
    clock = Clock()
    ran: list[str] = []
    witness = threading.Event()

    def handler(key: str, causes: frozenset[str]) -> Result:
        ran.append(key)
        if key == "w":
            witness.set()
        return DONE

    queue: WorkQueue[str] = WorkQueue(handler, workers=1, clock=clock)
    try:
        queue.add_after("gone", "poll", 10)
        queue.forget("gone")
        assert queue.delayed("gone") is None
        assert queue.wait_idle(LIMIT)  # nothing pending: the forgotten add is not waited for
        queue.add_after("w", "poll", 10)  # due with the forgotten one: the tick that fires it would fire both
        clock.now += 11
        assert witness.wait(LIMIT)
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert ran == ["w"]


def test_a_terminal_failure_is_told_within_its_pass_not_retried_and_the_next_add_runs_again() -> None:
    ran: list[frozenset[str]] = []
    told: list[tuple[str, str, bool, str | None]] = []
    queues: list[WorkQueue[str]] = []

    def handler(key: str, causes: frozenset[str]) -> Result:
        ran.append(causes)
        if len(ran) == 1:
            raise RuntimeError("a retry")  # retried, with back-off: a failure count to reset
        if len(ran) == 2:
            queues[0].add(key, "child")  # added during the terminal pass: exactly one more pass, after it
            raise Terminal(ValueError("status.phase: not one of the phases"))
        return DONE

    def terminal(key: str, error: Terminal) -> None:
        # on the pass's worker: the key is still being processed, and its pass id is set
        told.append((key, str(error), queues[0].processing(key), current_pass()))

    queues.append(WorkQueue(handler, workers=2, base_delay=0.001, terminal=terminal, label=lambda k: f"K/{k}"))
    queue = queues[0]
    try:
        queue.add("ns/a", "spec")
        assert queue.wait_idle(LIMIT)
        assert queue.backoff("ns/a") == 0.001  # reset: no failure is counted against the key any more
        assert queue.delayed("ns/a") is None  # and no retry is pending
        queue.add("ns/a", "spec")  # a spec edit: a pass as usual
        assert queue.wait_idle(LIMIT)
    finally:
        queue.shutdown()
    assert ran == [frozenset({"spec"}), frozenset({"retry"}), frozenset({"child"}), frozenset({"spec"})]
    assert len(told) == 1
    key, said, processing, pass_id = told[0]
    assert (key, said, processing) == ("ns/a", "ValueError: status.phase: not one of the phases", True)
    assert pass_id is not None
    assert pass_id.startswith("K/ns/a#")


def test_a_terminal_failure_that_cannot_be_told_is_retried() -> None:
    ran: list[frozenset[str]] = []
    told: list[str] = []

    def handler(key: str, causes: frozenset[str]) -> Result:
        ran.append(causes)
        raise Terminal(ValueError("a bug"))

    def terminal(key: str, error: Terminal) -> None:
        told.append(key)
        if len(told) == 1:
            raise ConnectionError("the API server is away")

    backoff = settled(WorkQueue(handler, workers=1, base_delay=0.001, terminal=terminal), "k")
    assert ran == [frozenset({"created"}), frozenset({"retry"})]
    assert told == ["k", "k"]
    assert backoff == 0.001


def test_every_log_line_of_a_pass_carries_its_id_and_lines_outside_passes_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log_pass_ids()
    log_pass_ids()  # installed once: a second call changes nothing
    logger = logging.getLogger("speculator_operator.test_pass_ids")
    child = logging.getLogger("kubernetes.client.test_pass_ids")  # another library's logger: the same

    def handler(key: str, causes: frozenset[str]) -> Result:
        logger.info("reconciling %s", key)
        child.warning("a slow answer")
        return DONE

    queue: WorkQueue[str] = WorkQueue(handler, workers=1, label=lambda k: f"SpeculatorDeployment/ns/{k}")
    with caplog.at_level(logging.INFO):
        try:
            logger.info("before any pass")
            queue.add("a", "spec")
            assert queue.wait_idle(LIMIT)
            queue.add("a", "child")
            assert queue.wait_idle(LIMIT)
            logger.info("after the passes")
        finally:
            queue.shutdown()
    records = [r for r in caplog.records if r.name in (logger.name, child.name)]
    ids = [getattr(r, "pass_id", None) for r in records]
    assert ids[0] is None
    assert ids[-1] is None
    assert records[0].getMessage() == "before any pass"
    first, second = ids[1], ids[3]
    assert first is not None
    assert second is not None
    assert first != second
    assert ids[1:5] == [first, first, second, second]
    assert first.startswith("SpeculatorDeployment/ns/a#")
    assert second.startswith("SpeculatorDeployment/ns/a#")
    assert records[1].getMessage() == f"pass={first} reconciling a"
    assert records[4].getMessage() == f"pass={second} a slow answer"
    assert current_pass() is None
