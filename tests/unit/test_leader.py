"""The Lease rules of runtime/election.py: who creates, renews, waits and takes over, judged on the
candidate's own clock."""

from __future__ import annotations

from datetime import UTC, datetime

from speculator_operator.runtime.election import Action, Record, Seen, decide, expired, observe, released

WALL = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)


def held(by: str, renewed_minute: int = 0, transitions: int = 0) -> Record:
    return Record(by, 15, WALL, WALL.replace(minute=renewed_minute), transitions)


def test_no_lease_is_created_holding_it() -> None:
    d = decide(None, None, "a", 15, now=100.0, wall=WALL)
    assert d.action is Action.CREATE
    assert d.write == Record("a", 15, WALL, WALL, 0)


def test_the_holder_renews_and_keeps_its_acquire_time_and_transitions() -> None:
    current = held("a", transitions=3)
    later = WALL.replace(second=30)
    d = decide(current, None, "a", 15, now=100.0, wall=later)
    assert d.action is Action.RENEW
    assert d.write is not None
    assert (d.write.holder, d.write.acquired, d.write.renewed, d.write.transitions) == ("a", WALL, later, 3)


def test_another_current_holder_is_waited_on_until_its_record_stops_changing_for_a_lease_duration() -> None:
    seen = None
    # b renews every 2 s: each new renewTime restarts our clock, however far apart the wall clocks are
    for t, minute in ((100.0, 1), (102.0, 2), (104.0, 3)):
        d = decide(held("b", minute), seen, "a", 15, now=t, wall=WALL)
        assert d.action is Action.WAIT
        assert d.write is None
        seen = d.seen
    assert seen is not None
    assert seen.at == 104.0
    # b stops renewing: the same record for 15 s is still b's; past it, a takes over
    assert decide(held("b", 3), seen, "a", 15, now=119.0, wall=WALL).action is Action.WAIT
    d = decide(held("b", 3, transitions=4), seen, "a", 15, now=119.5, wall=WALL)
    assert d.action is Action.WAIT  # the record changed (transitions): the clock restarted
    taken = decide(held("b", 3, transitions=4), d.seen, "a", 15, now=135.0, wall=WALL)
    assert taken.action is Action.TAKE
    assert taken.write == Record("a", 15, WALL, WALL, 5)


def test_a_released_lease_is_taken_at_once() -> None:
    current = held("b", transitions=2)
    handed_back = released(current, "b", WALL)
    assert handed_back is not None
    assert (handed_back.holder, handed_back.duration_s, handed_back.transitions) == ("", 1, 2)
    d = decide(handed_back, None, "a", 15, now=100.0, wall=WALL)
    assert d.action is Action.TAKE
    assert d.write is not None
    assert (d.write.holder, d.write.transitions) == ("a", 3)


def test_only_the_holder_releases() -> None:
    assert released(held("b"), "a", WALL) is None


def test_the_clock_restarts_only_when_the_record_changes() -> None:
    first = observe(None, held("b"), 10.0)
    assert observe(first, held("b"), 20.0) is first
    assert observe(first, held("b", 1), 20.0) == Seen(held("b", 1), 20.0)
    assert not expired(first, 25.0)
    assert expired(first, 25.1)
    assert expired(Seen(None, 10.0), 10.0)
