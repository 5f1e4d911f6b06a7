"""What arrives between a deployment's passes is held in its controller's inbox: the event loop puts, a pass
(on a work queue's thread) takes. Nothing put may be lost to a take that runs at the same moment."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from speculator_operator.controllers import drift

OWNER = ("ns", "owner")
HOLDS = 20_000


def _edited(name: str) -> dict[str, Any]:
    """A child Deployment whose replicas another manager owns: a drift the event loop holds."""
    fields = {"f:spec": {"f:replicas": {}}}
    managed = [{"manager": "kubectl", "operation": "Update", "subresource": "scale", "fieldsV1": fields}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "managedFields": managed}}


@pytest.fixture
def switching() -> Iterator[None]:
    """Threads switch as often as the interpreter allows: a put and a take interleave at every bytecode they
    can, instead of once in 5 ms."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    drift.clear()
    try:
        yield
    finally:
        sys.setswitchinterval(before)
        drift.clear()


def test_no_drift_is_lost_between_the_event_loop_and_a_pass(switching: None) -> None:
    bodies = [_edited(f"child-{i}") for i in range(HOLDS)]
    taken: list[drift.Drift] = []
    done = threading.Event()

    def passes() -> None:
        while not done.is_set():
            taken.extend(drift.take(OWNER))

    worker = threading.Thread(target=passes)
    worker.start()
    try:
        for body in bodies:
            assert drift.hold(body, "ns", "owner", "MODIFIED")
    finally:
        done.set()
        worker.join()
    taken.extend(drift.take(OWNER))  # what the last pass left for the next
    names = [name for _, _, _, name, _ in taken]
    assert len(names) == HOLDS, f"{HOLDS - len(set(names))} of {HOLDS} drifts lost"
    assert set(names) == {f"child-{i}" for i in range(HOLDS)}


def test_drifts_a_restoration_could_not_apply_are_held_again_ahead_of_newer_ones() -> None:
    drift.clear()
    try:
        assert drift.hold(_edited("a"), "ns", "owner", "MODIFIED")
        first = drift.take(OWNER)
        assert drift.hold(_edited("b"), "ns", "owner", "MODIFIED")  # arrived while the pass ran
        assert drift.hold(_edited("a"), "ns", "owner", "MODIFIED")  # and "a" again
        drift.keep(OWNER, first)  # its apply met a moved child (runtime/executor.Moved)
        assert [name for _, _, _, name, _ in drift.take(OWNER)] == ["a", "b"]  # each once, the kept first
        drift.keep(OWNER, [])
        assert drift.take(OWNER) == []
    finally:
        drift.clear()


def test_an_inbox_holds_per_key_until_taken_forgotten_or_cleared() -> None:
    from speculator_operator.runtime.inbox import Inbox
    from speculator_operator.runtime.metrics import _tables

    box: Inbox[str, int] = Inbox("test.inbox")
    assert _tables["test.inbox"]() == 0
    box.put("a", 1)
    assert box.update("a", lambda held: (held or 0) + 1) == 2
    assert box.update("b", lambda held: None) is None  # None holds nothing
    assert "b" not in box
    box.put("b", 5)
    assert _tables["test.inbox"]() == 2
    assert box.get("a") == 2
    assert box.take("a") == 2
    assert box.take("a") is None
    box.update_all(lambda key, held: None if key == "b" else held)
    assert len(box) == 0
    box.put("c", 1)
    box.forget("c")
    box.put("d", 1)
    box.clear()
    assert box.get("d") is None
    assert len(box) == 0
