"""The status models at the pass's edges (api/common.py): a stored status is read as its model knows it,
unknown keys left out rather than refused; a status about to be written is refused with the place of every
key or value its model does not take (the API server would prune an unknown key without a word)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from speculator_operator.api.common import StatusInvalid, evolve, read_status, status_problems
from speculator_operator.api.deployment import SpeculatorDeploymentStatus
from speculator_operator.api.trainjob import SpeculatorTrainJobStatus
from speculator_operator.runtime.controller import PassStatus, StatusRefused

READY = {"type": "Ready", "status": "True", "reason": "Ready", "lastTransitionTime": "2026-12-01T06:00:00Z"}


def test_a_stored_status_comes_back_exactly_as_stored_less_what_the_model_does_not_know() -> None:
    stored: dict[str, Any] = {
        "phase": "Ready",
        "observedGeneration": 3,
        "conditions": [{**READY, "legacy": "x"}],
        "readyReplicas": 2,
        "acceptance": {"rate": 0.5, "pods": {"counted": 2, "retired": 1}},
        "servingNotes": "an older operator's key",
    }
    known = read_status(SpeculatorDeploymentStatus, stored)
    assert known == {
        "phase": "Ready",
        "observedGeneration": 3,
        "conditions": [READY],
        "readyReplicas": 2,
        "acceptance": {"rate": 0.5, "pods": {"counted": 2}},
    }
    # nothing it knows is changed or filled in: reading what it wrote gives it back
    assert read_status(SpeculatorDeploymentStatus, known) == known


def test_an_object_missing_a_required_key_is_left_out_and_the_rest_is_kept() -> None:
    stored = {"phase": "Ready", "retrain": {"job": "j"}, "conditions": [{"type": "Ready", "status": "True"}, READY]}
    assert read_status(SpeculatorDeploymentStatus, stored) == {"phase": "Ready", "conditions": [READY]}


def test_a_value_of_a_form_the_model_does_not_take_is_left_out_on_read() -> None:
    known = read_status(SpeculatorTrainJobStatus, {"phase": "Exploded", "stage": "train", "progress": {"epoch": "x"}})
    assert known == {"stage": "train", "progress": {}}


def test_a_status_to_write_is_refused_for_an_unknown_key_a_snake_case_key_or_a_wrong_value() -> None:
    sound = {"phase": "Ready", "conditions": [READY], "readyReplicas": 2}
    assert status_problems(SpeculatorDeploymentStatus, sound) == []
    assert status_problems(SpeculatorDeploymentStatus, {**sound, "readyReplica": 2}) == [
        "readyReplica: Extra inputs are not permitted"
    ]
    assert status_problems(SpeculatorDeploymentStatus, {"phase": "Ready", "ready_replicas": 2}) == [
        "ready_replicas: not a field of SpeculatorDeploymentStatus"
    ]
    wrong = status_problems(SpeculatorTrainJobStatus, {"phase": "Training", "evaluation": {"rate": "high"}})
    assert [p.split(":")[0] for p in wrong] == ["evaluation.rate"]


def test_a_misspelt_or_misshapen_field_fails_where_the_status_is_built_and_again_at_the_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from speculator_operator.runtime import kube

    pending = SpeculatorDeploymentStatus(phase="Pending")
    with pytest.raises(TypeError, match="ready_replica"):
        evolve(pending, None, ready_replica=1)  # a planner's misspelt field: no status, an error
    with pytest.raises(StatusInvalid) as refused:
        evolve(pending, None, ready_replicas="two")
    assert isinstance(refused.value.__cause__, ValidationError)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(kube, "patch_status", lambda *args: sent.append(args[4]))
    status = PassStatus(SpeculatorDeploymentStatus, "speculatordeployments", "ns", "a", {"phase": "Pending"})
    # a model built without validation (model_construct) is still checked before it is sent
    bad = SpeculatorDeploymentStatus.model_construct(phase="Ready", ready_replicas="one")
    with pytest.warns(UserWarning, match="serializ"):  # pydantic's own word on dumping it
        status.set(bad, "child")
    with pytest.raises(StatusRefused, match="readyReplicas"), pytest.warns(UserWarning, match="serializ"):
        status.write()
    assert sent == []
    status = PassStatus(SpeculatorDeploymentStatus, "speculatordeployments", "ns", "a", {"phase": "Pending"})
    status.set(evolve(pending, None, phase="Ready", ready_replicas=1), "child")
    assert status.write()
    assert sent == [{"phase": "Ready", "readyReplicas": 1}]
