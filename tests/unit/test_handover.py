"""A train job's hand-over kept in the deployment's status (planning/handover.py): which offer is taken, what it
must be, and how long it holds."""

from __future__ import annotations

from typing import Any

from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.planning import Problem
from speculator_operator.planning.handover import offer_due, offer_of, served, speculator_digest, take_offer

SPEC = SpeculatorDeploymentSpec.model_validate(
    {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "s3://drafts/old"}}
)


def stj(name: str = "q-retrain-1", deploy_to: str = "qwen", phase: str = "Succeeded", model: str = "Qwen/Qwen3-8B",
        uri: str = "s3://drafts/new/sha256-1") -> dict[str, Any]:  # fmt: skip
    done = {"phase": phase, "checkpoint": {"uri": uri}, "completionTime": "2026-12-05T10:00:00Z"}
    spec = {"verifier": {"model": model}, "deployTo": deploy_to, "output": {"credentials": {"name": "s3"}}}
    return {"metadata": {"name": name}, "spec": spec, "status": done}


def test_a_succeeded_job_naming_the_deployment_is_taken_with_its_location_and_credentials() -> None:
    taken = take_offer(stj(), "q-retrain-1", "qwen", SPEC)
    assert not isinstance(taken, Problem)
    assert (taken.train_job, taken.uri, taken.credentials) == ("q-retrain-1", "s3://drafts/new/sha256-1", "s3")
    assert taken.speculator == speculator_digest(SPEC)
    status = SpeculatorDeploymentStatus(handed_over=taken)
    assert served(SPEC, status) == taken
    # a new choice in git (spec.speculator edited) supersedes it; an edit elsewhere does not
    edited = SPEC.model_copy(update={"speculator": SPEC.speculator.model_copy(update={"source": "s3://drafts/mine"})})
    assert served(edited, status) is None
    scaled = SPEC.model_copy(update={"serving": SPEC.serving.model_copy(update={"replicas": 3})})
    assert served(scaled, status) == taken


def test_an_offer_that_is_not_for_this_deployment_or_not_done_is_refused_with_a_reason() -> None:
    assert isinstance(take_offer(stj(deploy_to="other"), "q-retrain-1", "qwen", SPEC), Problem)
    pending = take_offer(stj(phase="Training"), "q-retrain-1", "qwen", SPEC)
    assert isinstance(pending, Problem)
    assert pending.reason == "TrainJobPending"
    mismatch = take_offer(stj(model="meta-llama/Llama-3.1-8B"), "q-retrain-1", "qwen", SPEC)
    assert isinstance(mismatch, Problem)
    assert mismatch.reason == "TrainJobMismatch"
    assert isinstance(take_offer(None, "q-retrain-1", "qwen", SPEC), Problem)


def test_only_a_later_offer_than_the_one_held_is_read() -> None:
    held = take_offer(stj(), "q-retrain-1", "qwen", SPEC)
    assert not isinstance(held, Problem)
    assert offer_due({}, None) is None
    assert offer_due({"q-retrain-1": ("2026-12-05T10:00:00Z", held.uri)}, None) == "q-retrain-1"
    assert offer_due({"q-retrain-1": ("2026-12-05T10:00:00Z", held.uri)}, held) is None  # taken already
    earlier = {"old": ("2026-12-01T10:00:00Z", "s3://drafts/new/sha256-0")}
    assert offer_due(earlier, held) is None  # listed again after a restart: does not take back a later one
    later = {**earlier, "q-retrain-1": ("2026-12-05T10:00:00Z", held.uri), "next": ("2026-12-06T10:00:00Z", "s3://x")}
    assert offer_due(later, held) == "next"


def test_a_watched_train_job_offers_only_once_it_succeeded_with_a_location_and_names_a_deployment() -> None:
    assert offer_of(stj()) == ("qwen", "q-retrain-1", "2026-12-05T10:00:00Z", "s3://drafts/new/sha256-1")
    assert offer_of(stj(phase="Training")) is None
    assert offer_of(stj(uri="")) is None
    unnamed = stj()
    del unnamed["spec"]["deployTo"]
    assert offer_of(unnamed) is None
