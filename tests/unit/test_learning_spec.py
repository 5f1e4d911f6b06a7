"""spec.learning and status.learning (api/learning.py): off unless set, the defaults, the bounds the model and the
CRD both hold, and the CEL rules the CRD carries (the API server evaluates them: tests/cluster/test_crds.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from speculator_operator.api.common import typed_status
from speculator_operator.api.crds import speculator_deployment_crd
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.deployment.rules import LEARNING_RULES
from speculator_operator.api.learning import Capture, Learning

BASE = {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}}
LEARNING = {"storage": {"location": "s3://captures/qwen"}}


def learning(**over: Any) -> dict[str, Any]:
    """spec.learning with `over` merged into its blocks (capture={"mode": ...} and so on)."""
    out: dict[str, Any] = {"storage": dict(LEARNING["storage"])}
    for block, fields in over.items():
        out[block] = {**out.get(block, {}), **fields}
    return out


def schema() -> dict[str, Any]:
    version = speculator_deployment_crd()["spec"]["versions"][0]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def test_learning_is_off_unless_set_and_a_spec_without_it_is_written_as_before() -> None:
    spec = SpeculatorDeploymentSpec.model_validate(BASE)
    assert spec.learning is None
    assert "learning" not in spec.wire()
    assert "default" not in schema()["properties"]["learning"]  # the API server fills in no block either
    assert SpeculatorDeploymentStatus().learning is None


def test_a_learning_block_with_only_its_storage_takes_every_default() -> None:
    got = SpeculatorDeploymentSpec.model_validate({**BASE, "learning": LEARNING}).learning
    assert got is not None
    assert got.wire() == {
        "capture": {"fraction": 0.1, "mode": "All", "maxPerHour": 3600},
        "storage": {"location": "s3://captures/qwen", "retentionDays": 30},
        "trigger": {"minNewSamples": 1000, "cooldownSeconds": 86400},
        "training": {"capturedShare": 0.5, "heldOut": 0.1},
    }
    assert got.capture.effective_threshold is None  # mode All compares with nothing
    drift = Learning.model_validate(learning(trigger={"drift": {}})).trigger.drift
    assert drift is not None
    assert (drift.margin, drift.windows, drift.baseline_windows) == (0.05, 3, 3)
    # the CRD's defaults are the model's: the blocks default to {} and their fields to the same values
    props = schema()["properties"]["learning"]["properties"]
    assert all(props[b]["default"] == {} for b in ("capture", "trigger", "training"))
    assert props["capture"]["properties"]["fraction"]["default"] == 0.1
    assert "default" not in props["storage"]  # required: where user data goes is never guessed


def test_below_threshold_compares_with_its_threshold_or_one_half() -> None:
    assert Capture(mode="BelowThreshold").effective_threshold == 0.5
    assert Capture(mode="BelowThreshold", threshold=0.3).effective_threshold == 0.3


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "no storage": ({"capture": {}}, "storage"),
    "fraction zero": (learning(capture={"fraction": 0}), "fraction"),
    "fraction above one": (learning(capture={"fraction": 1.5}), "fraction"),
    "unknown mode": (learning(capture={"mode": "Worst"}), "mode"),
    "threshold above one": (learning(capture={"mode": "BelowThreshold", "threshold": 1.2}), "threshold"),
    "cap zero": (learning(capture={"maxPerHour": 0}), "maxPerHour"),
    "cap too large": (learning(capture={"maxPerHour": 10_000_001}), "maxPerHour"),
    "33 redactions": (learning(capture={"redact": [{"pattern": "x"}] * 33}), "redact"),
    "empty pattern": (learning(capture={"redact": [{"pattern": ""}]}), "pattern"),
    "hub storage": ({"storage": {"location": "hf://acme/captures"}}, "location"),
    "gcs storage": ({"storage": {"location": "gs://bucket/captures"}}, "location"),
    "a bucket without a prefix": ({"storage": {"location": "s3://bucket"}}, "location"),
    "retention zero": (learning(storage={"retentionDays": 0}), "retentionDays"),
    "retention over ten years": (learning(storage={"retentionDays": 3651}), "retentionDays"),
    "margin above one": (learning(trigger={"drift": {"margin": 1.5}}), "margin"),
    "no windows": (learning(trigger={"drift": {"windows": 0}}), "windows"),
    "no baseline windows": (learning(trigger={"drift": {"baselineWindows": 0}}), "baselineWindows"),
    "no new samples": (learning(trigger={"minNewSamples": 0}), "minNewSamples"),
    "negative cooldown": (learning(trigger={"cooldownSeconds": -1}), "cooldownSeconds"),
    "cooldown over a year": (learning(trigger={"cooldownSeconds": 31_536_001}), "cooldownSeconds"),
    "no captured share": (learning(training={"capturedShare": 0}), "capturedShare"),
    "half held out and more": (learning(training={"heldOut": 0.6}), "heldOut"),
    "a misspelt field": (learning(trigger={"minSamples": 10}), "minSamples"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_model_refuses_what_the_crd_refuses(case: str) -> None:
    raw, field = REFUSED[case]
    with pytest.raises(ValidationError) as err:
        SpeculatorDeploymentSpec.model_validate({**BASE, "learning": raw})
    assert any(field in map(str, e["loc"]) for e in err.value.errors()), err.value


def test_the_crd_holds_the_same_bounds() -> None:
    props = schema()["properties"]["learning"]["properties"]
    capture = props["capture"]["properties"]
    assert (capture["fraction"]["minimum"], capture["fraction"]["maximum"]) == (0.0001, 1)
    assert capture["redact"]["maxItems"] == 32
    assert capture["redact"]["items"]["properties"]["pattern"]["maxLength"] == 512
    location = props["storage"]["properties"]["location"]
    assert location["pattern"].startswith("^(s3://")
    assert "hf://" not in location["pattern"]
    assert props["storage"]["required"] == ["location"]
    assert props["training"]["properties"]["heldOut"]["maximum"] == 0.5


def test_every_learning_rule_is_on_the_spec_names_its_field_and_passes_a_spec_without_learning() -> None:
    rules = schema()["x-kubernetes-validations"]
    for rule in LEARNING_RULES:
        assert rule in rules
        assert rule["fieldPath"].startswith((".learning", ".serving"))  # the field the user must change
        assert rule["message"]
        assert ":" in rule["message"]
        # a spec without learning is never refused: every rule is `!has(self.learning) || ...`
        assert rule["rule"].startswith("!has(self.learning) || ")
    needs = " ".join(r["message"] for r in LEARNING_RULES)
    for what in ("upgradePolicy.canary", "upgradePolicy.trainTemplate", "serving.parallelism.nodes 1",
                 "audit.allowLossy", "serving.adaptiveVerification"):  # fmt: skip
        assert what in needs
    capture = schema()["properties"]["learning"]["properties"]["capture"]
    assert capture["x-kubernetes-validations"] == [{
        "rule": "!has(self.threshold) || self.mode == 'BelowThreshold'",
        "message": "capture.threshold applies to mode BelowThreshold only (mode All captures every sampled request)",
        "fieldPath": ".threshold",
    }]  # fmt: skip


def test_the_learning_description_says_why_each_rule_holds() -> None:
    said = schema()["properties"]["learning"]["description"]
    for why in ("a learned draft always goes through a canary", "what a learning run trains from",
                "the capture runs in the serving pod's API server", "only lossless decoding"):  # fmt: skip
        assert why in said
    capture = schema()["properties"]["learning"]["properties"]["capture"]["description"]
    storage = schema()["properties"]["learning"]["properties"]["storage"]["description"]
    assert "without a restart" in capture
    assert "rolls the serving pods" in storage


def test_status_learning_is_read_back_as_stored_and_what_it_does_not_know_is_left_out() -> None:
    stored = {"learning": {
        "captured": 120, "skipped": 3, "dropped": 0, "bytes": 40960, "samplesSinceRun": 120,
        "countedUntil": "2026-12-07T12:00:00Z", "belowWindows": 2,
        "baseline": {"value": 0.71, "metric": "Alpha", "draftRevision": "d1", "windows": 3, "drafts": 900,
                     "since": "2026-12-07T11:45:00Z", "complete": True},
        "lastTrigger": {"at": "2026-12-06T12:00:00Z", "reason": "Drift", "message": "figures"},
        "job": {"name": "q-learn-1", "snapshot": "s3://captures/qwen/snapshots/1.json", "samples": 1000,
                "state": "Succeeded", "verdict": "RolledBack", "startedAt": "2026-12-06T12:00:00Z",
                "finishedAt": "2026-12-06T14:00:00Z"},
        "rejectedAtSamples": 100, "nextTriggerAt": "2026-12-07T12:00:00Z", "blocked": "the cooldown holds",
    }}  # fmt: skip
    status = typed_status(SpeculatorDeploymentStatus, stored)
    assert status.learning is not None
    assert status.learning.wire() == stored["learning"]
    older = {"learning": {**stored["learning"], "job": {"state": "Running"}, "futureField": 1}}
    kept = typed_status(SpeculatorDeploymentStatus, older).learning
    assert kept is not None
    assert kept.job is None
    assert kept.captured == 120
