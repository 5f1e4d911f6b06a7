"""Which children count as changed by hand (planning/drift.py)."""

from __future__ import annotations

from typing import Any

from speculator_operator.planning.drift import edited_by, fingerprint, taken_from

OURS = "speculator-operator"


def entry(manager: str, fields: dict[str, Any], operation: str = "Update", sub: str = "") -> dict[str, Any]:
    e: dict[str, Any] = {"manager": manager, "operation": operation, "fieldsV1": fields}
    if sub:
        e["subresource"] = sub
    return e


def child(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"managedFields": list(entries)}}


APPLIED = entry(OURS, {"f:metadata": {}, "f:spec": {}}, operation="Apply")
IMAGE = {"f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"vllm"}': {"f:image": {}}}}}}}


def test_a_spec_edit_is_drift() -> None:
    assert edited_by(child(APPLIED, entry("kubectl-edit", IMAGE)), OURS) == "kubectl-edit"


def test_kubectl_scale_is_drift() -> None:
    scale = entry("kubectl", {"f:spec": {"f:replicas": {}}}, sub="scale")
    assert edited_by(child(APPLIED, scale), OURS) == "kubectl"


def test_status_writers_and_metadata_edits_are_not() -> None:
    status = entry("kube-controller-manager", {"f:status": {}}, sub="status")
    revision = entry("kube-controller-manager", {"f:metadata": {"f:annotations": {}}})
    label = entry("kubectl-label", {"f:metadata": {"f:labels": {}}})
    assert edited_by(child(APPLIED, status, revision, label), OURS) is None
    assert edited_by({"metadata": {}}, OURS) is None


def test_the_fingerprint_names_what_others_own_of_the_spec() -> None:
    edit = entry("kubectl-edit", IMAGE)
    label = entry("kubectl-label", {"f:metadata": {"f:labels": {}}})
    assert fingerprint(child(APPLIED, edit), OURS) == fingerprint(child(APPLIED, label, edit), OURS)
    other = entry("kubectl-edit", {"f:spec": {"f:replicas": {}}})
    assert fingerprint(child(APPLIED, edit), OURS) != fingerprint(child(APPLIED, other), OURS)


def test_an_apply_took_back_what_others_lost_and_not_what_they_keep() -> None:
    scale = entry("kubectl-scale", {"f:spec": {"f:replicas": {}}}, sub="scale")
    env = entry("kubectl-patch", {"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}})
    status = entry("kube-controller-manager", {"f:status": {}}, sub="status")
    # the force apply took spec.replicas back from the scale: it is named, the env var's owner is not
    assert taken_from(child(APPLIED, env, scale), child(APPLIED, env), OURS) == ["kubectl-scale"]
    # an extra env var survives the apply, and a status write meanwhile is no restoration
    assert taken_from(child(APPLIED, env), child(APPLIED, env, status), OURS) == []
    # a field taken from an entry that keeps others still names it
    both = entry("kubectl-edit", {"f:spec": {"f:replicas": {}, "f:paused": {}}})
    left = entry("kubectl-edit", {"f:spec": {"f:paused": {}}})
    assert taken_from(child(APPLIED, both), child(APPLIED, left), OURS) == ["kubectl-edit"]
    assert taken_from(None, child(APPLIED), OURS) == []
