"""The SpeculatorDeployment planner, without a cluster."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api.common import stored
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.domain import qualification
from speculator_operator.domain.releases import get_release
from speculator_operator.planning import Problem
from speculator_operator.planning.adoption import kept_revision
from speculator_operator.planning.deployment import Observed, apply_failed, plan, refresh_serving, serving_status
from speculator_operator.planning.inputs import InputAction, draft_change, verifier_change
from speculator_operator.planning.retrain import (
    adopt_retrain,
    holds_for_retrain,
    retrain_due,
    retrain_job,
    retrain_name,
    retrain_refused,
    retrain_status,
    train_job_output,
)
from speculator_operator.render.serving import Inputs, draft_of, legacy_revision_hash, render

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint
from ..clock import NOW

SPEC = SpeculatorDeploymentSpec.model_validate(
    {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}, "serving": {"replicas": 2}}
)


def S(raw: dict[str, Any] | None = None) -> SpeculatorDeploymentStatus:
    """A status as the pass reads it (camelCase on the wire, the typed model in the planner)."""
    return SpeculatorDeploymentStatus.model_validate(raw or {})


def W(status: SpeculatorDeploymentStatus) -> dict[str, Any]:
    """A planned status as the pass writes it."""
    return stored(status)


def conds(status: SpeculatorDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


@pytest.fixture
def good(tmp_path: Path) -> Any:
    write_checkpoint(tmp_path / "good", *eagle3())
    return audit(str(tmp_path / "good"), verifier=QWEN3_8B, release=get_release())


@pytest.fixture
def bad(tmp_path: Path) -> Any:
    config, tensors = eagle3()
    tensors["fc.weight"] = ("BF16", [4096, 4096])
    write_checkpoint(tmp_path / "bad", config, tensors)
    return audit(str(tmp_path / "bad"), verifier=QWEN3_8B, release=get_release())


def child(revision: str, ready: int, replicas: int = 2) -> dict[str, Any]:
    return {"metadata": {"generation": 1, "annotations": {"speculators.dev/revision": revision}},
            "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready,
                       "updatedReplicas": ready, "availableReplicas": ready}}  # fmt: skip


def test_passing_audit_renders_children_and_waits_for_replicas(good: Any) -> None:
    obs = Observed(generation=3, status=S(), verifier_revision="v1", audit=good)
    p = plan("q", "ns", "uid", SPEC, get_release(), obs, now=NOW)
    assert [c["kind"] for c in p.children or []] == ["Deployment", "Service", "PodDisruptionBudget"]
    assert p.status.phase == "Deploying"
    assert conds(p.status)["Audited"] == ("True", "AuditPassed")
    assert conds(p.status)["Ready"] == ("False", "RollingOut")
    assert all(c.observed_generation == 3 for c in p.status.conditions)
    assert p.status.num_speculative_tokens == 3
    ready = plan("q", "ns", "uid", SPEC, get_release(),
                 Observed(3, p.status, "v1", good, child=child(p.status.revision, 2)), now=NOW)  # fmt: skip
    assert ready.status.phase == "Ready"
    assert conds(ready.status)["Ready"] == ("True", "Ready")
    # the same world again: the same status (so nothing is written)
    again = plan("q", "ns", "uid", SPEC, get_release(),
                 Observed(3, ready.status, "v1", good, child=child(p.status.revision, 2)), now=NOW)  # fmt: skip
    assert again.status == ready.status
    assert again.events == []


def test_the_releases_level_is_in_status_and_said_once_per_release(
    good: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served = plan("q", "ns", "uid", SPEC, get_release(), Observed(generation=1, status=S(), verifier_revision="v1",
                                                                  audit=good), now=NOW)  # fmt: skip
    assert (served.status.release, served.status.release_level) == ("2026.11-vllm0.32", "Served")
    assert [e[:2] for e in served.events if e[1].startswith("Release")] == [("Normal", "ReleaseServed")]
    again = plan("q", "ns", "uid", SPEC, get_release(), Observed(1, served.status, "v1", good), now=NOW)
    assert [e for e in again.events if e[1].startswith("Release")] == []
    # a move to a release qualified without a device: its level in status, and a warning, once
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)
    (tmp_path / "2026.12-vllm0.34.json").write_text(json.dumps({
        "release": "2026.12-vllm0.34", "recorded": "2026-12-07", "machine": "m", "command": "c", "images": {},
        "checks": [{"name": "all", "passed": True}], "served": "not served"}))  # fmt: skip
    checked = get_release("2026.12-vllm0.34")
    moved = plan("q", "ns", "uid", SPEC, checked, Observed(2, served.status, "v1", good), now=NOW)
    assert (moved.status.release, moved.status.release_level) == ("2026.12-vllm0.34", "Checked")
    assert [e[:2] for e in moved.events if e[1].startswith("Release")] == [("Warning", "ReleaseChecked")]
    assert moved.status.revision != served.status.revision  # the release is part of the revision: one rollout


def test_a_pair_that_first_fails_its_audit_still_says_its_release_once(good: Any, bad: Any) -> None:
    failing = plan("q", "ns", "uid", SPEC, get_release(), Observed(1, S(), "v1", bad), now=NOW)
    assert failing.status.release == "2026.11-vllm0.32"  # written with the audit's result
    assert [e[:2] for e in failing.events if e[1].startswith("Release")] == [("Normal", "ReleaseServed")]
    fixed = plan("q", "ns", "uid", SPEC, get_release(), Observed(2, failing.status, "v1", good), now=NOW)
    assert [e for e in fixed.events if e[1].startswith("Release")] == []  # said with the status that recorded it


def test_failing_audit_creates_nothing_or_keeps_the_last_good_pair(bad: Any) -> None:
    p = plan("q", "ns", "uid", SPEC, get_release(), Observed(1, S(), "v1", bad), now=NOW)
    assert p.children is None
    assert p.status.phase == "Failed"
    assert conds(p.status)["Audited"] == ("False", "AuditFailed")
    assert any(f["rule"] == "fc-shape" for f in p.status.audit.findings)
    assert p.events[0][:2] == ("Warning", "AuditFailed")
    kept = plan("q", "ns", "uid", SPEC, get_release(), Observed(2, S(), "v2", bad, child=child("old", 2)), now=NOW)
    assert kept.children is None
    assert kept.status.phase == "Degraded"


def test_unreadable_input_waits() -> None:
    unreadable = ("CheckpointUnreadable", "s3://x/config.json: no such object")
    p = plan("q", "ns", "uid", SPEC, get_release(), Observed(1, S(), problem=unreadable), now=NOW)
    assert p.children is None
    assert p.status.phase == "Pending"
    assert conds(p.status)["Audited"] == ("Unknown", "CheckpointUnreadable")


def test_a_pod_the_api_server_refuses_is_said_in_its_words() -> None:
    refused = child("new", 0)
    message = 'pods "d-1" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false'
    refused["status"]["conditions"] = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}
    ]
    out = serving_status(SPEC, "new", refused)
    assert (out.ready, out.reason, out.problem) == (False, "FailedCreate", message)
    healed = child("new", 2)
    healed["status"]["conditions"] = [{"type": "ReplicaFailure", "status": "False"}]
    assert serving_status(SPEC, "new", healed).reason == "RolledOut"


def test_serving_status_counts_only_the_current_revision() -> None:
    assert serving_status(SPEC, "new", child("old", 2)).ready is False
    assert serving_status(SPEC, "new", child("old", 2)).updated_replicas == 0
    assert serving_status(SPEC, "new", child("new", 1)).ready is False
    assert serving_status(SPEC, "new", child("new", 2)).ready is True
    assert serving_status(SPEC, "new", None).reason == "NotDeployed"


def test_the_reconciles_status_already_says_what_its_new_child_will(good: Any) -> None:
    """The status is written before the children are applied: the new Deployment's first events (no status
    yet, then its pods created) find nothing to change."""
    p = plan("q", "ns", "uid", SPEC, get_release(), Observed(generation=1, status=S(), verifier_revision="v1",
                                                             audit=good), now=NOW)  # fmt: skip
    assert conds(p.status)["Serving"] == ("False", "RollingOut")
    created = {"metadata": {"generation": 1, "annotations": {"speculators.dev/revision": p.status.revision}}}
    assert refresh_serving(SPEC, p.status, created, 1, now=NOW) is p.status
    assert refresh_serving(SPEC, p.status, {**created, "status": {"observedGeneration": 1, "replicas": 2,
                                                                  "updatedReplicas": 2}}, 1,
                           now=NOW) is p.status  # fmt: skip


def test_pods_created_but_not_ready_are_not_a_status_write() -> None:
    """updatedReplicas alone moving leaves the status as it is (the next readiness change carries it)."""
    rolling = refresh_serving(SPEC, S({"phase": "Deploying", "revision": "new"}), child("new", 0), 1, now=NOW)
    created = child("new", 0)
    created["status"]["updatedReplicas"] = 2
    assert refresh_serving(SPEC, rolling, created, 1, now=NOW) is rolling
    one_ready = child("new", 1)
    one_ready["status"]["updatedReplicas"] = 2
    moved = refresh_serving(SPEC, rolling, one_ready, 1, now=NOW)
    assert (moved.ready_replicas, moved.updated_replicas) == (1, 2)
    assert refresh_serving(SPEC, moved, child("new", 2), 1, now=NOW).phase == "Ready"


@pytest.mark.parametrize(
    ("policy", "action", "reason"),
    [
        ("Redeploy", "redeploy", None),
        ("Pause", "pause", "VerifierChanged"),
        ("Retrain", "retrain", None),  # the controller starts the retraining (retrain_job, retrain_status)
    ],
)
def test_verifier_change_follows_the_policy(policy: str, action: str, reason: str | None) -> None:
    spec = SPEC.model_copy(
        update={"upgrade_policy": SPEC.upgrade_policy.model_copy(update={"on_verifier_change": policy})}
    )
    status = S({"verifierRevision": "v1", "conditions": []})
    assert verifier_change(spec, status, "v1", 1, now=NOW) == ("none", None)
    assert verifier_change(spec, S(), "v2", 1, now=NOW) == ("none", None)
    got, new = verifier_change(spec, status, "v2", 1, now=NOW)
    assert got == action
    if reason is None:
        assert new is None
    else:
        assert new is not None
        assert conds(new)["VerifierCurrent"] == ("False", reason)


def test_retraining_is_a_train_job_from_the_template_pinned_to_the_new_revision() -> None:
    template = {"algorithm": "eagle3", "data": {"sources": ["hf:org/chats"]}, "output": {"uri": "s3://d/new"}}
    spec = SPEC.model_copy(update={"upgrade_policy": SPEC.upgrade_policy.model_copy(
        update={"on_verifier_change": "Retrain", "train_template": template})})  # fmt: skip
    job = retrain_job("qwen", "ml", "uid-1", spec, "0123456789abcdef")
    assert job["metadata"]["name"] == "qwen-retrain-0123456789"
    assert job["spec"]["verifier"] == {"model": "Qwen/Qwen3-8B", "revision": "0123456789abcdef"}
    assert job["spec"]["deployTo"] == "qwen"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "release" not in job["spec"]  # nothing resolved: the train job's own default
    kept = retrain_job("qwen", "ml", "uid-1", spec, "0123456789abcdef", kept_release="2026.11-vllm0.32")
    assert kept["spec"]["release"] == "2026.11-vllm0.32"  # the release the deployment serves, not the default's
    named = spec.model_copy(update={"upgrade_policy": spec.upgrade_policy.model_copy(
        update={"train_template": {**template, "release": "2026.12-vllm0.34"}})})  # fmt: skip
    assert retrain_job("qwen", "ml", None, named, "r", kept_release="2026.11-vllm0.32")["spec"]["release"] == (
        "2026.12-vllm0.34"
    )
    assert retrain_name("qwen", "s3:ABC-def") == "qwen-retrain-abcdef"
    assert len(retrain_name("x" * 63, "0123456789abcdef")) <= 63
    status = retrain_status(S({"verifierRevision": "old"}), 2, job["metadata"]["name"], "new", None, now=NOW)
    assert conds(status)["VerifierCurrent"] == ("False", "Retraining")
    assert W(status)["retrain"] == {"job": "qwen-retrain-0123456789", "verifierRevision": "new"}
    bad = spec.model_copy(update={"upgrade_policy": spec.upgrade_policy.model_copy(
        update={"train_template": {**template, "algorithm": "medusa"}})})  # fmt: skip
    with pytest.raises(ValueError, match=r"trainTemplate\.algorithm"):
        retrain_job("qwen", "ml", None, bad, "r")
    with pytest.raises(ValueError, match="set by the operator"):
        retrain_job("qwen", "ml", None, spec.model_copy(update={"upgrade_policy": spec.upgrade_policy.model_copy(
            update={"train_template": {**template, "deployTo": "other"}})}), "r")  # fmt: skip
    with pytest.raises(ValueError, match="not set"):
        retrain_job("qwen", "ml", None, SPEC, "r")
    failed = retrain_status(S(), 1, None, "new", "upgradePolicy.trainTemplate is not set", now=NOW)
    assert conds(failed)["VerifierCurrent"] == ("False", "RetrainUnavailable")


def test_apply_failure_is_reported() -> None:
    status = apply_failed(S({"readyReplicas": 2}), 4, "403 Forbidden: exceeded quota", now=NOW)
    assert status.phase == "Degraded"
    assert conds(status)["Serving"] == ("False", "ApplyFailed")


def test_a_train_job_is_served_once_it_has_published_for_this_verifier() -> None:
    def stj(phase: str | None, model: str = "Qwen/Qwen3-8B", uri: str | None = "s3://d/x") -> dict[str, Any]:
        status: dict[str, Any] = {"phase": phase, "stage": "train", "checkpoint": {"uri": uri} if uri else None}
        return {"spec": {"verifier": {"model": model}, "output": {"credentials": {"name": "s3"}}}, "status": status}

    assert train_job_output(stj("Succeeded"), "j", "Qwen/Qwen3-8B") == ("s3://d/x", "s3")
    missing = train_job_output(None, "j", "Qwen/Qwen3-8B")
    assert isinstance(missing, Problem)
    assert missing.reason == "TrainJobPending"
    running = train_job_output(stj("Training", uri=None), "j", "Qwen/Qwen3-8B")
    assert isinstance(running, Problem)
    assert "is Training (stage train)" in running.message
    failed = Problem("TrainJobFailed", "SpeculatorTrainJob 'j' failed at stage train")
    assert train_job_output(stj("Failed"), "j", "Qwen/Qwen3-8B") == failed
    other = train_job_output(stj("Succeeded", model="meta/Llama"), "j", "Qwen/Qwen3-8B")
    assert isinstance(other, Problem)
    assert other.reason == "TrainJobMismatch"


def test_a_retraining_pins_the_pair_until_its_result_is_rolled_out() -> None:
    template = {"algorithm": "eagle3", "data": {"sources": ["hf:o/d"]}, "output": {"uri": "s3://d/n"}}
    redeploy = SPEC.model_copy(update={"upgrade_policy": SPEC.upgrade_policy.model_copy(
        update={"train_template": template})})  # fmt: skip
    retrain = {"job": "q-retrain-new", "verifierRevision": "new"}
    in_flight = S({"retrain": retrain, "observedGeneration": 3})
    assert holds_for_retrain(in_flight, 3)
    assert not holds_for_retrain(in_flight, 4)  # something was asked since
    assert not holds_for_retrain(S({"observedGeneration": 3}), 3)
    assert not holds_for_retrain(in_flight, 3, "q-retrain-new")  # its own job just handed over
    assert holds_for_retrain(in_flight, 3, "someone-else")
    # a retrain request: refused without a template, or while one is in flight
    assert retrain_refused(SPEC, S()) == (
        "RetrainUnavailable",
        "retrain requested: upgradePolicy.trainTemplate is not set",
    )
    in_flight_refusal = retrain_refused(redeploy, in_flight)
    assert in_flight_refusal is not None
    assert in_flight_refusal[0] == "RetrainInFlight"
    assert retrain_refused(redeploy, S()) is None
    assert retrain_due(SPEC, InputAction.RETRAIN, S(), "new")
    assert not retrain_due(SPEC, InputAction.RETRAIN, in_flight, "new")  # once per revision
    assert retrain_due(redeploy, InputAction.REDEPLOY, S({"phase": "Degraded"}), "new")
    assert not retrain_due(SPEC, InputAction.REDEPLOY, S({"phase": "Degraded"}), "new")  # no template
    assert not retrain_due(redeploy, InputAction.REDEPLOY, S({"phase": "Ready"}), "new")  # the draft passed
    rolled = adopt_retrain(in_flight, S({"phase": "Deploying", "verifierRevision": "new", "retrain": retrain}))
    assert "retrain" not in W(rolled)
    kept = S({"phase": "Ready", "verifierRevision": "old", "retrain": retrain})
    assert adopt_retrain(in_flight, kept) is kept


def test_a_draft_change_follows_on_draft_change() -> None:
    def with_policy(policy: str) -> SpeculatorDeploymentSpec:
        update = {"upgrade_policy": SPEC.upgrade_policy.model_copy(update={"on_draft_change": policy})}
        return SPEC.model_copy(update=update)

    status = S({"draftRevision": "s3:old", "draftSource": "s3://d/x"})
    assert draft_change(with_policy("Redeploy"), status, "s3:old", 1, now=NOW).action == "none"
    assert draft_change(with_policy("Redeploy"), S(), "s3:new", 1, now=NOW).action == "none"  # nothing served yet
    assert draft_change(with_policy("Redeploy"), status, None, 1, now=NOW).action == "none"  # not resolved
    redeploy = draft_change(with_policy("Redeploy"), status, "s3:new", 1, now=NOW)
    assert redeploy.action == "redeploy"
    assert redeploy.status is None
    assert [e[:2] for e in redeploy.events] == [("Normal", "DraftChanged")]
    assert "s3:old" in redeploy.events[0][2]
    assert "s3:new" in redeploy.events[0][2]
    paused = draft_change(with_policy("Pause"), status, "s3:new", 1, now=NOW)
    assert paused.action == "pause"
    assert paused.status is not None
    assert conds(paused.status)["DraftCurrent"] == ("False", "DraftChanged")
    assert paused.status.draft_revision == "s3:old"  # nothing moves
    assert [e[:2] for e in paused.events] == [("Warning", "DraftChanged")]
    # the next poll sees the same change: no second write, no second event
    again = draft_change(with_policy("Pause"), paused.status, "s3:new", 1, now=NOW)
    assert again.status is not None
    assert W(again.status) == W(paused.status)
    assert again.events == []


def test_a_draft_change_waits_while_the_verifier_change_is_paused() -> None:
    spec = SPEC.model_copy(
        update={"upgrade_policy": SPEC.upgrade_policy.model_copy(update={"on_verifier_change": "Pause"})}
    )
    status = S({"draftRevision": "s3:old", "verifierRevision": "v1"})
    _, paused = verifier_change(spec, status, "v2", 1, now=NOW)
    assert paused is not None
    change = draft_change(spec, paused, "s3:new", 1, now=NOW)
    assert change.action == "pause"  # rolling the draft out would move the verifier too
    assert change.status is not None
    assert "verifier change is paused" in conds_messages(change.status)["DraftCurrent"]


def conds_messages(status: SpeculatorDeploymentStatus) -> dict[str, str]:
    return {c.type: c.message for c in status.conditions}


def test_the_serving_message_is_built_from_the_render_notes_field_not_read_back() -> None:
    """status.renderNotes holds what the render chose on its own; a child event's refresh says them from there,
    whatever the stored message says (a message is never parsed)."""
    said = {"type": "Serving", "status": "False", "reason": "RollingOut", "message": "revision r0; Stale: words",
            "observedGeneration": 3, "lastTransitionTime": "2026-12-01T06:00:00Z"}  # fmt: skip
    notes = [{"reason": "CutoffUnsupported", "message": "speculation stays on at every batch size"}]
    status = {"phase": "Deploying", "revision": "r1", "renderNotes": notes, "conditions": [said]}
    new = refresh_serving(SPEC, S(status), child("r1", 2), 3, now=NOW)
    assert conds_messages(new)["Serving"] == "revision r1; CutoffUnsupported: speculation stays on at every batch size"
    # a status written before the field existed: the revision alone, until the object's next reconcile
    older = refresh_serving(
        SPEC, S({k: v for k, v in status.items() if k != "renderNotes"}), child("r1", 2), 3, now=NOW
    )
    assert conds_messages(older)["Serving"] == "revision r1"


def test_a_pair_an_earlier_operator_rolled_out_keeps_its_revision_name(good: Any) -> None:
    """Operators up to fe501e0 hashed a revision without the server image: the pair they rolled out is taken
    over under its old name (no rollout for a name), and anything that changes gets a new one."""
    first = plan("q", "ns", "uid", SPEC, get_release(), Observed(generation=3, status=S(), verifier_revision="v1",
                                                                     audit=good), now=NOW)  # fmt: skip
    new_name = first.status.revision
    # what such an operator applied: the same render under the old name
    inputs = Inputs("q", "ns", SPEC, get_release(), draft_of(good.checkpoint), "v1", "uid")
    rendered = render(inputs)
    assert rendered.revision == new_name
    old_name = legacy_revision_hash(inputs, rendered.vllm_args)
    assert old_name != new_name
    old_child = next(c for c in render(replace(inputs, keep_revision=old_name)).children if c["kind"] == "Deployment")
    old_child = {**old_child, "status": child(old_name, 2)["status"]}
    taken = plan("q", "ns", "uid", SPEC, get_release(),
                 Observed(3, S({**W(first.status), "revision": old_name}), "v1", good, child=old_child),
                 now=NOW)  # fmt: skip
    assert taken.status.revision == old_name
    (ours,) = [c for c in taken.children or [] if c["kind"] == "Deployment"]
    assert ours["spec"]["template"] == old_child["spec"]["template"]  # nothing for the pods to roll for
    assert taken.events == []
    # another image in the child (a build pinned since): the new name, and the rollout it implies
    other = json.loads(json.dumps(old_child))
    other["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/server@sha256:" + "0" * 64
    moved = plan("q", "ns", "uid", SPEC, get_release(),
                 Observed(3, S({**W(first.status), "revision": old_name}), "v1", good, child=other),
                 now=NOW)  # fmt: skip
    assert moved.status.revision == new_name
    # a stored name that is not the old hash of these inputs (a spec edit since): the new name
    assert kept_revision(inputs, rendered, "0123456789ab", old_child) is None
