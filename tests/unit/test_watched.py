"""What a child's event and the pod watch hand a deployment's serving pass (planning/watched.py,
controllers/observed.py): the events that ask for no pass, the trimmed copies the planner reads the same as the
whole objects, and when the watched pods are trusted."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.controllers import observed
from speculator_operator.planning.deployment import served_image, serving_status
from speculator_operator.planning.pods import first_problem, pod_problem
from speculator_operator.planning.watched import (
    pods_agree,
    ready,
    scrape_target,
    serving_inputs,
    trimmed_child,
    trimmed_pod,
)

REV = "speculators.dev/revision"
SPEC = SpeculatorDeploymentSpec.model_validate(
    {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}, "serving": {"replicas": 2}}
)


def child(ready: int = 0, *, revision: str = "r1", observed_generation: int = 2, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "d",
            "namespace": "ns",
            "uid": "u-child",
            "generation": 2,
            "resourceVersion": "100",
            "annotations": {REV: revision, "speculators.dev/applied-hash": "abc"},
            "labels": {"app.kubernetes.io/managed-by": "speculator-operator"},
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"}],
        },
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "vllm", "image": "server:cpu"}]}}},
        "status": {
            "observedGeneration": observed_generation,
            "replicas": 2,
            "updatedReplicas": 2,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [
                {
                    "type": "Progressing",
                    "status": "True",
                    "reason": "ReplicaSetUpdated",
                    "lastUpdateTime": "2026-12-04T10:00:00Z",
                },
            ],
            **status,
        },
    }


def pod(
    name: str, *, ready: bool = True, revision: str = "r1", waiting: str | None = None, **meta: Any
) -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": {"reason": waiting, "message": "back-off"}} if waiting else {"running": {}}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {REV: revision, "app": "x"},
            "uid": name,
            "managedFields": [{"manager": "kubelet"}],
            **meta,
        },
        "spec": {"containers": [{"name": "vllm", "image": "server:cpu", "args": ["--port", "8000"]}], "nodeName": "n1"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": ready,
                    "image": "server:cpu",
                    "imageID": "sha256:" + "ab" * 32,
                    "state": state,
                    "restartCount": 3,
                    "started": ready,
                },
            ],
        },
    }


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    observed.clear()
    yield
    observed.clear()


def test_an_event_that_changes_nothing_the_counts_read_asks_for_no_pass() -> None:
    first = child(ready=1)
    assert observed.moved(first, "ADDED")  # the first event since the operator started always asks
    same = copy.deepcopy(first)
    same["metadata"]["resourceVersion"] = "101"
    same["status"]["conditions"][0]["lastUpdateTime"] = "2026-12-04T10:00:05Z"
    same["status"]["conditions"][0]["reason"] = "NewReplicaSetAvailable"
    same["metadata"]["managedFields"].append({"manager": "kubectl-label"})
    assert serving_inputs(same) == serving_inputs(first)
    assert not observed.moved(same, "MODIFIED")
    # each thing serving_status reads moves it
    for moved in (
        child(ready=2),
        child(ready=1, revision="r2"),
        child(ready=1, observed_generation=1),
        child(ready=1, replicas=3),
        child(ready=1, updatedReplicas=1),
        child(ready=1, availableReplicas=0),
        child(ready=1, conditions=[{"type": "ReplicaFailure", "status": "True", "message": "quota"}]),
    ):
        assert serving_inputs(moved) != serving_inputs(first)
    assert observed.moved(child(ready=2), "MODIFIED")
    assert not observed.moved(child(ready=2), "MODIFIED")
    # a pass's own apply: the watch's echo of the object it got back asks for none, the next status does
    rolled = child(ready=2, revision="r2", observed_generation=1)
    observed.applied(rolled)
    assert not observed.moved(rolled, "MODIFIED")
    assert observed.moved(child(ready=2, revision="r2"), "MODIFIED")
    # a deleted child always asks (its owner restores it), and is forgotten: its next event asks again
    assert observed.moved(child(ready=2), "DELETED")
    assert observed.moved(child(ready=2), "ADDED")


@pytest.mark.parametrize("ready", [0, 1, 2])
def test_the_trimmed_child_and_pods_say_what_the_whole_objects_say(ready: int) -> None:
    whole = child(ready=ready, conditions=[{"type": "ReplicaFailure", "status": "True", "message": "quota"}])
    assert serving_status(SPEC, "r1", trimmed_child(whole)) == serving_status(SPEC, "r1", whole)
    pods = [pod("a", ready=ready > 0), pod("b", ready=ready > 1), pod("c", revision="r0", waiting="CrashLoopBackOff"),
            pod("d", ready=False, waiting="ImagePullBackOff")]  # fmt: skip
    trimmed = [trimmed_pod(p) for p in pods]
    assert first_problem(trimmed) == first_problem(pods)
    assert served_image("r1", trimmed) == served_image("r1", pods)
    assert serving_status(SPEC, "r1", trimmed_child(whole), trimmed) == serving_status(SPEC, "r1", whole, pods)
    assert "managedFields" not in trimmed_child(whole)["metadata"]
    assert "spec" not in trimmed_child(whole)
    assert "managedFields" not in trimmed[0]["metadata"]
    assert "args" not in trimmed[0]["spec"]["containers"][0]


def test_a_trimmed_pod_keeps_every_problem_the_whole_pod_shows_and_no_timestamps() -> None:
    started = {"startedAt": "2026-12-05T08:00:00Z", "finishedAt": "2026-12-05T08:01:00Z", "containerID": "c://1"}
    crash = pod("a", ready=False, waiting="CrashLoopBackOff")
    crash["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"reason": "Error", "exitCode": 3, **started}}
    oom = pod("b", ready=False)
    oom["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": "OOMKilled", "exitCode": 137, **started}}
    unschedulable = pod("c", ready=False)
    unschedulable["status"]["conditions"][0] = {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes are available",
        "lastProbeTime": None, "lastTransitionTime": "2026-12-05T08:00:00Z",
    }  # fmt: skip
    init_stuck = pod("d", ready=False)
    init_stuck["status"]["initContainerStatuses"] = [
        {"name": "stage", "ready": False, "image": "op", "imageID": "", "restartCount": 0,
         "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}
    ]  # fmt: skip
    for whole in (crash, oom, unschedulable, init_stuck):
        trimmed = trimmed_pod(whole)
        assert pod_problem(trimmed) == pod_problem(whole) is not None
        for dropped in ("lastTransitionTime", "lastProbeTime", "startedAt", "finishedAt", "containerID"):
            assert dropped not in str(trimmed)
    # a running container keeps no state at all: nothing reads it
    assert "state" not in trimmed_pod(pod("e"))["status"]["containerStatuses"][0]


def test_the_scrape_dials_the_trimmed_pod_it_shares_with_the_serving_counts() -> None:
    """One copy of each serving pod is kept (controllers/observed.serving_pods): the scrape's target comes from
    it, with the address, the http port and the revision of the whole pod, and the same readiness rule."""
    whole = pod("a")
    whole["spec"]["containers"][0]["ports"] = [
        {"name": "grpc", "containerPort": 9000},
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
    ]
    trimmed = trimmed_pod(whole)
    assert scrape_target(trimmed) == {"pod": "a", "ip": "10.0.0.1", "port": 8000, "revision": "r1"}
    assert scrape_target(trimmed) == scrape_target(whole)
    assert [p["name"] for p in trimmed["spec"]["containers"][0]["ports"]] == ["http"]
    # not yet addressed, not ready, or being deleted: the scrape leaves it out, as a ReplicaSet does
    assert scrape_target(trimmed_pod(pod("b") | {"status": {}}))["ip"] is None
    assert ready(trimmed)
    assert not ready(trimmed_pod(pod("c", ready=False)))
    assert not ready(trimmed_pod(pod("d", deletionTimestamp="2026-12-04T10:00:00Z")))


def test_watched_pods_are_used_only_when_they_agree_with_the_childs_ready_count() -> None:
    pods = [trimmed_pod(pod("a")), trimmed_pod(pod("b", ready=False))]
    assert pods_agree(trimmed_child(child(ready=1)), pods)
    # the pod watch has not brought b's readiness yet: read them instead
    assert not pods_agree(trimmed_child(child(ready=2)), pods)
    # a pod being deleted is not counted, as its ReplicaSet does not count it
    leaving = [trimmed_pod(pod("a", deletionTimestamp="2026-12-04T10:00:00Z")), trimmed_pod(pod("b"))]
    assert pods_agree(trimmed_child(child(ready=1)), leaving)
    assert not pods_agree(None, pods)


def test_what_is_held_is_the_latest_and_is_taken_once() -> None:
    key = ("ns", "owner")
    assert observed.take(key) is None
    observed.hold(key, [pod("a", ready=False)], child=child(ready=0))
    observed.hold(key, [pod("a")], child=child(ready=1))
    # a stuck pod's event brings the pods as watched now and keeps the child held before
    observed.hold(key, [pod("a"), pod("b", waiting="ImagePullBackOff", ready=False)])
    seen = observed.take(key)
    assert seen is not None
    assert seen.child is not None
    assert seen.child["status"]["readyReplicas"] == 1
    assert [p["metadata"]["name"] for p in seen.pods] == ["a", "b"]
    assert observed.take(key) is None
    observed.hold(key, [])
    observed.forget(key)
    assert observed.take(key) is None


def test_a_child_deleted_or_changed_by_hand_drops_what_was_held_for_its_owner() -> None:
    """The drift's pass reads the child itself: a child held from an earlier event may be gone."""
    from speculator_operator.controllers.watches import child_changed

    whole = child(ready=1)
    whole["metadata"]["labels"]["speculators.dev/deployment"] = "owner"
    index = {("ns", "owner"): [trimmed_pod(pod("a"))]}
    asyncio.run(child_changed(body=whole, namespace="ns", type="MODIFIED", serving_pods=index))
    seen = observed.take(("ns", "owner"))
    assert seen is not None
    assert seen.child == trimmed_child(whole)
    assert [p["metadata"]["name"] for p in seen.pods] == ["a"]
    # the same again asks for nothing and holds nothing
    asyncio.run(child_changed(body=whole, namespace="ns", type="MODIFIED", serving_pods=index))
    assert observed.take(("ns", "owner")) is None
    asyncio.run(child_changed(body=child(ready=2) | {"metadata": whole["metadata"]}, namespace="ns",
                              type="MODIFIED", serving_pods=index))  # fmt: skip
    asyncio.run(child_changed(body=whole, namespace="ns", type="DELETED", serving_pods=index))
    assert observed.take(("ns", "owner")) is None


def test_a_child_whose_ready_count_moved_asks_for_its_owners_pass_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the pass after readiness moved can make the owner Ready: it goes ahead of the other quick passes."""
    from speculator_operator.controllers import deployment, watches

    asked: list[tuple[str, int]] = []

    def enqueue(namespace: str, name: str, cause: str, priority: int = 0) -> None:
        asked.append((cause, priority))

    monkeypatch.setattr(deployment.CONTROLLER, "enqueue", enqueue)
    index: dict[Any, Any] = {("ns", "owner"): []}

    def event(body: dict[str, Any], type: str = "MODIFIED") -> None:
        body["metadata"]["labels"]["speculators.dev/deployment"] = "owner"
        asyncio.run(watches.child_changed(body=body, namespace="ns", type=type, serving_pods=index))

    event(child(ready=0, observed_generation=1))  # the first event since the operator started
    event(child(ready=0))  # its controller saw the generation: a count moved, not readiness
    event(child(ready=1))
    event(child(ready=1, updatedReplicas=1))
    event(child(ready=2))
    event(child(ready=2))  # nothing moved: no pass
    event(child(ready=2), "DELETED")
    assert asked == [("child", 0), ("child", 0), ("child", 1), ("child", 0), ("child", 1), ("drift", 0)]
