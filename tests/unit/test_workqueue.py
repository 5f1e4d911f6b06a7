"""The work queue's promises (runtime/workqueue.py): one pass per key at a time, triggers during a pass coalesce
into exactly one more, failures retry with a capped, doubling back-off that success resets, and a pass may ask
for another later. Every wait below is on a condition; the timeouts only bound a failing test."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

from speculator_operator.runtime.workqueue import DONE, Result, WorkQueue

LIMIT = 10.0  # seconds a failing test may hang before it fails
Handler = Callable[[str, frozenset[str]], Result]


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
