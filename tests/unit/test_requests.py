"""One-shot request annotations (planning/requests.py): acted on once per value, recorded in status."""

from __future__ import annotations

from speculator_operator.api.common import stored
from speculator_operator.api.deployment import SpeculatorDeploymentStatus
from speculator_operator.api.labels import RESOLVE_REQUEST_ANNOTATION, RESUME_REQUEST_ANNOTATION
from speculator_operator.planning.requests import Request, acted, pending


def test_a_new_value_is_pending_until_the_status_records_it() -> None:
    annotations = {RESUME_REQUEST_ANNOTATION: "1733400000", "unrelated": "x"}
    assert pending(annotations, None) == {Request.RESUME: "1733400000"}
    status = acted(SpeculatorDeploymentStatus(phase="Ready"), pending(annotations, None))
    recorded = stored(status)["requests"]
    assert recorded == {"resume": "1733400000"}
    assert pending(annotations, recorded) == {}  # acted on once
    again = {**annotations, RESUME_REQUEST_ANNOTATION: "1733400060", RESOLVE_REQUEST_ANNOTATION: "a"}
    assert pending(again, recorded) == {Request.RESUME: "1733400060", Request.RESOLVE: "a"}
    assert pending({RESUME_REQUEST_ANNOTATION: ""}, None) == {}  # an empty value asks for nothing
    both = acted(status, {Request.RESOLVE: "a"})
    assert stored(both)["requests"] == {"resume": "1733400000", "resolve": "a"}
    assert acted(status, {}) is status
