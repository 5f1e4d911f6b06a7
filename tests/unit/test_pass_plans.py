"""The plans the SpeculatorDeployment pass's poll, refresh and canary clean-up return (planning/poll.py,
planning/deployment.clean_up, planning/retrain.plan_retrain), and the train job's retention plan, without a
cluster: the decisions are made here, the executor only carries them out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.controllers import retention
from speculator_operator.planning.deployment import clean_up
from speculator_operator.planning.poll import Polled, draft_polled, retrain_after_reconcile, verifier_polled
from speculator_operator.planning.retention import Published
from speculator_operator.planning.retrain import plan_retrain, retraining
from speculator_operator.planning.writes import Create, DeleteFolders, Writes

SPEC = SpeculatorDeploymentSpec.model_validate(
    {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}, "serving": {"replicas": 2}}
)
TEMPLATE = {"algorithm": "eagle3", "data": {"sources": ["hf:org/chats"]}, "output": {"uri": "s3://d/new"}}
NOW = datetime(2099, 1, 1, tzinfo=UTC)
NOW_STAMP = "2099-01-01T00:00:00Z"


def with_policy(**update: Any) -> SpeculatorDeploymentSpec:
    return SPEC.model_copy(update={"upgrade_policy": SPEC.upgrade_policy.model_copy(update=update)})


def S(raw: dict[str, Any] | None = None) -> SpeculatorDeploymentStatus:
    return SpeculatorDeploymentStatus.model_validate(raw or {})


def canary(state: str, candidate: str = "r2") -> dict[str, Any]:
    return {"state": state, "candidate": {"revision": candidate}, "incumbent": {"revision": "r1"}}


LWS = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "pair-group"}}


def test_a_promoted_canary_goes_once_its_revision_serves_every_replica() -> None:
    status, gone, said = clean_up(S({"phase": "Ready", "revision": "r2", "canary": canary("Promoting")}), "pair",
                                  SPEC, None, "r2", NOW)  # fmt: skip
    assert status.canary is not None
    assert status.canary.state == "Promoted"
    assert status.canary.verdict_at == NOW_STAMP
    assert gone == [("apps/v1", "Deployment", "pair-canary")]
    assert said == []
    for waiting in (
        S({"phase": "Deploying", "revision": "r2", "canary": canary("Promoting")}),  # not every replica yet
        S({"phase": "Ready", "revision": "r1", "canary": canary("Promoting")}),  # the incumbent still serves
        S({"phase": "Ready", "revision": "r2", "canary": canary("Analyzing")}),
    ):
        assert clean_up(waiting, "pair", SPEC, None, "r2", NOW) == (waiting, [], [])


def test_the_workload_of_the_other_kind_is_retired_once_the_new_one_is_ready() -> None:
    ready = S({"phase": "Ready", "revision": "r2"})
    status, gone, said = clean_up(ready, "pair", SPEC, LWS, "r2", NOW)
    assert status == ready
    assert gone == [("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "pair-group")]
    assert [(e[0], e[1]) for e in said] == [("Normal", "LayoutChanged")]
    assert "revision r2" in said[0][2]
    assert clean_up(S({"phase": "Deploying", "revision": "r2"}), "pair", SPEC, LWS, "r2", NOW)[1:] == ([], [])


def test_a_new_verifier_under_redeploy_reconciles_then_retrains_only_if_the_draft_failed() -> None:
    spec = with_policy(on_verifier_change="Redeploy", train_template=TEMPLATE)
    polled = verifier_polled(spec, S({"verifierRevision": "v1"}), "v2", 1, now=NOW)
    assert polled == Polled(reconcile=True, retrain="v2", retrain_if_degraded=True)
    assert retrain_after_reconcile(spec, S({"phase": "Degraded"}), "v2")
    assert not retrain_after_reconcile(spec, S({"phase": "Deploying"}), "v2")  # the draft passed against it
    assert not retrain_after_reconcile(with_policy(on_verifier_change="Redeploy"), S({"phase": "Degraded"}), "v2")


def test_a_new_verifier_under_retrain_retrains_once_per_revision() -> None:
    spec = with_policy(on_verifier_change="Retrain", train_template=TEMPLATE)
    assert verifier_polled(spec, S({"verifierRevision": "v1"}), "v2", 1, now=NOW) == Polled(retrain="v2")
    retraining_v2 = S({"verifierRevision": "v1", "retrain": {"job": "j", "verifierRevision": "v2"}})
    assert verifier_polled(spec, retraining_v2, "v2", 1, now=NOW) == Polled()


def test_an_unchanged_verifier_polls_the_draft_unless_a_retraining_pins_the_pair() -> None:
    assert verifier_polled(SPEC, S({"verifierRevision": "v1"}), "v1", 1, now=NOW) == Polled(draft=True)
    pinned = S({"verifierRevision": "v1", "observedGeneration": 1, "retrain": {"job": "j", "verifierRevision": "v2"}})
    assert verifier_polled(SPEC, pinned, "v1", 1, now=NOW) == Polled()
    paused = verifier_polled(with_policy(on_verifier_change="Pause"), S({"verifierRevision": "v1"}), "v2", 1, now=NOW)
    assert paused.status is not None
    assert paused.draft
    assert not paused.reconcile


def test_a_new_draft_reconciles_or_pauses() -> None:
    serving = S({"draftRevision": "s3:old", "revision": "r1", "phase": "Ready"})
    redeploy = draft_polled(with_policy(on_draft_change="Redeploy"), serving, "s3:new", 1, now=NOW)
    assert redeploy.reconcile
    assert redeploy.status is None
    assert not redeploy.draft
    paused = draft_polled(with_policy(on_draft_change="Pause"), serving, "s3:new", 1, now=NOW)
    assert not paused.reconcile
    assert paused.status is not None
    assert draft_polled(SPEC, serving, "s3:old", 1, now=NOW) == Polled()


def test_a_retraining_plans_its_train_job_or_says_why_not() -> None:
    spec = with_policy(on_verifier_change="Retrain", train_template=TEMPLATE)
    status, writes = plan_retrain("pair", "ns", "u1", spec, S({"verifierRevision": "v1"}), 3, "v2", now=NOW)
    assert [c.plural for c in writes.creates] == ["speculatortrainjobs"]
    create = writes.creates[0]
    assert isinstance(create, Create)
    assert create.name == "pair-retrain-v2"
    assert status.retrain is not None
    assert status.retrain.job == "pair-retrain-v2"
    assert writes.events == ()  # said only once the executor created it
    assert retraining("pair-retrain-v2", "v2") == (
        "Normal",
        "Retraining",
        "SpeculatorTrainJob pair-retrain-v2 for verifier v2",
    )
    status, writes = plan_retrain("pair", "ns", "u1", SPEC, S({"verifierRevision": "v1"}), 3, "v2", now=NOW)
    assert writes.creates == ()
    assert [e[1] for e in writes.events] == ["RetrainUnavailable"]
    assert status.retrain is None


@pytest.fixture
def listing(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the retention plan observes: the published folders (newest last) and what the cluster names."""
    seen: dict[str, Any] = {"named": set()}
    folders = [Published(f"s3://b/out/sha256-{i:016x}", f"2026-01-0{i}T00:00:00Z") for i in range(1, 5)]
    monkeypatch.setattr(retention, "secret_data", lambda namespace, name: {"AWS_ACCESS_KEY_ID": "k"})
    monkeypatch.setattr(retention, "s3_client", lambda creds: object())
    monkeypatch.setattr(retention, "_published", lambda s3, bucket, prefix: (folders, None))
    monkeypatch.setattr(retention, "_cluster_references", lambda pointer: seen["named"])
    return seen


def test_retention_plans_the_s3_deletes_and_says_them_once_done(listing: dict[str, Any]) -> None:
    spec = SpeculatorTrainJobSpec.model_validate({
        "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "eagle3", "data": {"sources": ["hf:org/chats"]},
        "output": {"uri": "s3://b/out", "keepLatest": 2}})  # fmt: skip
    writes, kept = retention.plan_prune("ns", "tj", spec, 2)
    assert isinstance(writes.folders, DeleteFolders)
    assert sorted(writes.folders.uris) == ["s3://b/out/sha256-0000000000000001", "s3://b/out/sha256-0000000000000002"]
    assert writes.folders.credentials == {"AWS_ACCESS_KEY_ID": "k"}
    assert [e[1] for e in writes.events] == ["Pruned"]
    assert kept is not None
    assert kept.deleted == list(writes.folders.uris)
    listing["named"] = None  # a ReplicaSet that does not say what it stages: nothing older goes
    writes, kept = retention.plan_prune("ns", "tj", spec, 2)
    assert writes.folders is not None
    assert writes.folders.uris == ()
    assert [e[1] for e in writes.events] == ["PruneDeferred"]


def test_a_retention_listing_that_fails_plans_only_its_event(monkeypatch: pytest.MonkeyPatch) -> None:
    from speculator_operator.runtime.kube import CredentialsError

    def unreadable(namespace: str, name: str | None) -> dict[str, str]:
        raise CredentialsError("Secret ns/creds not found")

    monkeypatch.setattr(retention, "secret_data", unreadable)
    spec = SpeculatorTrainJobSpec.model_validate({
        "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "eagle3", "data": {"sources": ["hf:org/chats"]},
        "output": {"uri": "s3://b/out", "keepLatest": 2}})  # fmt: skip
    writes, kept = retention.plan_prune("ns", "tj", spec, 2)
    assert kept is None
    assert writes.folders is None
    said = "output.keepLatest not applied to s3://b/out: Secret ns/creds not found"
    assert writes == Writes(events=(("Warning", "PruneFailed", said),))


def test_a_stopped_multi_node_server_is_deleted_as_its_group_and_its_service() -> None:
    """planning/trainjob._stop_servers names a multi-node server's LeaderWorkerSet: the pass's guard takes it (it
    refused anything but a Deployment or a Service, so such a pass raised on every retry)."""
    from speculator_operator.controllers.trainjob import server_deletes
    from speculator_operator.planning.writes import Delete
    from speculator_operator.render import group

    stop = [(group.API_VERSION, group.KIND, "job-verifier-group"), ("v1", "Service", "job-verifier")]
    assert server_deletes(stop) == (
        Delete(group.API_VERSION, group.KIND, "job-verifier-group"),
        Delete("v1", "Service", "job-verifier"),
    )
    with pytest.raises(ValueError, match="not a server kind"):
        server_deletes([("v1", "Secret", "creds")])
