"""The kubelet's words for a pod that cannot make progress, as the resources show them."""

from __future__ import annotations

from typing import Any

from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.planning.deployment import refresh_serving, serving_status
from speculator_operator.planning.pods import first_problem, pod_problem, refused_creation, terminated_words

from ..clock import NOW


def pod(
    name: str,
    *,
    waiting: str | None = None,
    message: str = "",
    terminated: dict[str, Any] | None = None,
    revision: str = "r1",
    unschedulable: str | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if waiting:
        state["waiting"] = {"reason": waiting, "message": message}
    if terminated:
        state["terminated"] = terminated
    status: dict[str, Any] = {"containerStatuses": [{"name": "vllm", "state": state or {"running": {}}}]}
    if unschedulable:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        ]
    return {"metadata": {"name": name, "labels": {"speculators.dev/revision": revision}}, "status": status}


def test_stuck_pods_are_named_in_the_kubelets_words() -> None:
    pull = pod("a", waiting="ErrImagePull", message="failed to pull image x: connection refused")
    assert pod_problem(pull) == (
        "ErrImagePull",
        "pod a, container vllm: ErrImagePull: failed to pull image x: connection refused",
    )
    oom = pod("b", terminated={"reason": "OOMKilled", "exitCode": 137})
    assert pod_problem(oom) == ("OOMKilled", "pod b, container vllm: OOMKilled (exit code 137)")
    nowhere = pod("c", unschedulable="0/4 nodes are available: insufficient nvidia.com/gpu")
    assert pod_problem(nowhere) == ("Unschedulable", "pod c: 0/4 nodes are available: insufficient nvidia.com/gpu")
    # starting or running is not a problem; a container creating is not either
    assert pod_problem(pod("d")) is None
    assert pod_problem(pod("e", waiting="ContainerCreating")) is None
    assert first_problem([pod("z", waiting="CrashLoopBackOff"), pull]) == pod_problem(pull)  # by name: stable
    assert terminated_words({"reason": "Error", "exitCode": 2}) == "Error (exit code 2)"


def test_a_rolling_out_deployment_shows_its_stuck_pods_reason() -> None:
    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}}
    )
    child = {
        "metadata": {"generation": 1, "annotations": {"speculators.dev/revision": "r1"}},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1},
    }
    stuck = pod("p1", waiting="ImagePullBackOff", message="Back-off pulling image server:cpu-missing")
    old = pod("p0", waiting="CrashLoopBackOff", revision="r0")  # another revision's pod says nothing here
    serving = serving_status(spec, "r1", child, [old, stuck])
    assert (serving.ready, serving.reason) == (False, "ImagePullBackOff")
    assert "server:cpu-missing" in serving.problem
    assert serving_status(spec, "r1", child, [old]).reason == "RollingOut"
    status = SpeculatorDeploymentStatus(phase="Deploying", revision="r1")
    refreshed = refresh_serving(spec, status, child, 1, [stuck], now=NOW)
    conds = {c.type: c for c in refreshed.conditions}
    assert conds["Serving"].reason == "ImagePullBackOff"
    assert "Back-off pulling image" in conds["Ready"].message


def test_a_job_whose_pods_are_refused_shows_the_latest_refusal_in_the_api_servers_words() -> None:
    def event(reason: str, at: str, message: str) -> dict[str, Any]:
        return {"reason": reason, "lastTimestamp": at, "message": message}

    assert refused_creation("t-train", []) is None
    assert refused_creation("t-train", [event("SuccessfulCreate", "2026-12-01T10:00:00Z", "Created pod")]) is None
    events = [
        event(
            "FailedCreate", "2026-12-01T10:00:05Z", 'pods "t-train-x" is forbidden: violates PodSecurity "restricted"'
        ),
        event("FailedCreate", "2026-12-01T10:00:01Z", "exceeded quota: gpu"),
        event("SuccessfulCreate", "2026-12-01T10:00:09Z", "Created pod"),
    ]
    assert refused_creation("t-train", events) == (
        "FailedCreate",
        'job t-train: pods "t-train-x" is forbidden: violates PodSecurity "restricted"',
    )
    # an event recorded by the events API has only an eventTime; a long message is cut to the status's size
    long = [{"reason": "FailedCreate", "eventTime": "2026-12-01T10:00:00.000000Z", "message": "x" * 5000}]
    reason, message = refused_creation("t-train", long) or ("", "")
    assert reason == "FailedCreate"
    assert message.startswith("job t-train: xxx")
    assert len(message) == 600
