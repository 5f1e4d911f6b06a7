"""The operator's own scheduling rules (runtime/schedule.py): which generation is reconciled when, and
kopf's timer semantics for the periodic jobs."""

from __future__ import annotations

from speculator_operator.runtime.schedule import Every, Generations


def test_each_generation_is_reconciled_once_and_every_object_at_start() -> None:
    g = Generations()
    assert g.wants("a", 1, now=0.0)  # first seen since the operator started: reconciled (kopf's resume)
    g.done("a", 1)
    assert not g.wants("a", 1, now=1.0)  # a status write of its own: nothing to do
    assert g.wants("a", 2, now=2.0)  # the spec changed
    g.done("a", 2)
    assert not g.wants("a", 1, now=3.0)  # an older generation's event arriving late is not acted on


def test_a_failure_waits_for_its_delay_unless_the_spec_moves() -> None:
    g = Generations()
    g.retry("a", 1, now=10.0, delay=30.0)
    assert not g.wants("a", 1, now=11.0)  # its own status write's event does not retry it at once
    assert g.retries_due(now=39.0) == []
    assert g.retries_due(now=40.0) == ["a"]
    assert g.wants("a", 1, now=40.0)
    assert g.wants("a", 2, now=12.0)  # a new generation is reconciled at once
    g.done("a", 2)
    assert g.retries_due(now=100.0) == []  # and settles the retry


def test_forgetting_an_object_forgets_its_generation_and_retry() -> None:
    g = Generations()
    g.done("a", 3)
    g.retry("b", 1, now=0.0, delay=1.0)
    g.forget("a")
    g.forget("b")
    assert g.wants("a", 1, now=0.0)
    assert g.retries_due(now=5.0) == []


def test_every_runs_after_its_initial_delay_then_at_its_interval() -> None:
    e = Every(interval=15.0, initial=7.5)
    assert not e.due("a", now=0.0, changed_at=0.0)  # first sight: scheduled
    assert not e.due("a", now=7.0, changed_at=0.0)
    assert e.due("a", now=7.5, changed_at=0.0)
    assert not e.due("a", now=22.0, changed_at=0.0)
    assert e.due("a", now=22.5, changed_at=0.0)
    assert not e.due("b", now=22.5, changed_at=0.0)  # each object on its own schedule


def test_every_waits_while_the_object_changes() -> None:
    e = Every(interval=60.0, idle=30.0)
    assert not e.due("a", now=0.0, changed_at=0.0)
    assert not e.due("a", now=60.0, changed_at=45.0)  # changed 15 s ago: postponed
    assert e.due("a", now=75.0, changed_at=45.0)
    e.forget("a")
    assert not e.due("a", now=80.0, changed_at=0.0)  # seen afresh: a full interval again
    assert not e.due("a", now=139.0, changed_at=0.0)
    assert e.due("a", now=140.0, changed_at=0.0)
