"""Conditions by type, as the pass writes them: a transition time moves only with the status, the other types
stand in their order, a new type is appended, and a status holds each type once."""

from __future__ import annotations

from typing import Any

from speculator_operator.api.common import Condition, make_condition, merge_status, set_condition

from ..clock import NOW


def cond(kind: str, status: str, at: str, reason: str = "R") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": "", "lastTransitionTime": at}


def test_the_same_status_keeps_its_transition_time_and_takes_the_new_reason_and_message() -> None:
    stored = [cond("Ready", "True", "t3")]
    new = Condition(type="Ready", status="True", reason="New", message="m", last_transition_time="t5")
    assert set_condition(stored, new, now=NOW) == [
        {"type": "Ready", "status": "True", "reason": "New", "message": "m", "lastTransitionTime": "t3"}
    ]


def test_a_changed_status_moves_the_transition_time() -> None:
    stored = [cond("Ready", "False", "t0")]
    given = set_condition(
        stored, Condition(type="Ready", status="True", reason="R", last_transition_time="t5"), now=NOW
    )
    assert given == [cond("Ready", "True", "t5")]
    stamped = set_condition(stored, Condition(type="Ready", status="True", reason="R"), now=NOW)
    assert stamped[0]["lastTransitionTime"] not in (None, "t0")
    assert stamped[0]["lastTransitionTime"] == "2026-12-07T12:00:00Z"  # the time handed in


def test_other_types_stand_in_their_order_and_a_new_type_is_appended() -> None:
    stored = [cond("A", "True", "t0"), cond("B", "True", "t0")]
    out = set_condition(stored, Condition(type="C", status="False", reason="R", last_transition_time="t1"), now=NOW)
    out = set_condition(out, Condition(type="A", status="False", reason="R", last_transition_time="t2"), now=NOW)
    assert out == [cond("A", "False", "t2"), cond("B", "True", "t0"), cond("C", "False", "t1")]


def test_merge_status_sets_the_generation_once_per_type_and_a_none_field_removes_a_key() -> None:
    status = {"conditions": [cond("Ready", "False", "t0")], "phase": "Deploying", "revision": "r1"}
    out = merge_status(
        status,
        7,
        make_condition(7, "Ready", True, "Ready"),
        make_condition(7, "Ready", True, "Ready", "again"),
        phase="Ready",
        revision=None,
        now=NOW,
    )
    assert out["observedGeneration"] == 7
    assert out["phase"] == "Ready"
    assert "revision" not in out
    assert [c["type"] for c in out["conditions"]] == ["Ready"]
    assert out["conditions"][0]["message"] == "again"
    assert out["conditions"][0]["observedGeneration"] == 7
    assert status["phase"] == "Deploying"  # the status given is not changed in place


def test_without_a_generation_the_stored_one_stands_and_no_conditions_key_is_added() -> None:
    status = {"observedGeneration": 4, "phase": "Ready"}
    assert merge_status(status, None, phase="Degraded") == {"observedGeneration": 4, "phase": "Degraded"}
    out = merge_status(status, None, make_condition(5, "Ready", False, "R"), now=NOW)
    assert out["observedGeneration"] == 4
    assert [c["type"] for c in out["conditions"]] == ["Ready"]
