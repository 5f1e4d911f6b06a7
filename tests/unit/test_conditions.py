"""Writing conditions by type: what a writer changed, laid over what is stored now."""

from __future__ import annotations

from typing import Any

from speculator_operator.planning import apply_condition_changes, condition_changes


def cond(kind: str, status: str, at: str, reason: str = "R") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "lastTransitionTime": at}


def test_changes_name_only_the_types_that_differ_and_a_dropped_type_as_none() -> None:
    old = [cond("Ready", "False", "t0"), cond("Audited", "True", "t0"), cond("Stale", "True", "t0")]
    new = [cond("Ready", "True", "t1"), cond("Audited", "True", "t0"), cond("Serving", "True", "t1")]
    assert condition_changes(old, new) == {
        "Ready": cond("Ready", "True", "t1"),
        "Serving": cond("Serving", "True", "t1"),
        "Stale": None,
    }
    assert condition_changes(new, new) == {}


def test_applied_over_a_newer_store_the_other_writers_conditions_stand() -> None:
    # this writer read [Ready False]; another has since stored Audited; this one turns Ready True
    changes = condition_changes([cond("Ready", "False", "t0")], [cond("Ready", "True", "t2")])
    stored = [cond("Ready", "False", "t0"), cond("Audited", "True", "t1")]
    assert apply_condition_changes(stored, changes) == [cond("Ready", "True", "t2"), cond("Audited", "True", "t1")]


def test_a_stale_writer_keeps_the_stored_transition_time_of_a_status_already_there() -> None:
    # the writer's copy said Ready False, so to it Ready True is a transition at t5; the store has had
    # Ready True since t3, and that time stands (the reason the writer gives is still written)
    changes = condition_changes([cond("Ready", "False", "t0")], [cond("Ready", "True", "t5", reason="New")])
    stored = [cond("Ready", "True", "t3")]
    assert apply_condition_changes(stored, changes) == [cond("Ready", "True", "t3", reason="New")]


def test_new_types_are_appended_in_order_and_a_none_removes_one() -> None:
    stored = [cond("A", "True", "t0"), cond("B", "True", "t0")]
    changes = {"B": None, "C": cond("C", "False", "t1"), "D": cond("D", "True", "t1")}
    expected = [cond("A", "True", "t0"), cond("C", "False", "t1"), cond("D", "True", "t1")]
    assert apply_condition_changes(stored, changes) == expected
