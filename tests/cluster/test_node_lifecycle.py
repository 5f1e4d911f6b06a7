"""The real node's own life, before the session's cluster takes the machine's one node: a pod runs on it
with the network the harness made (cluster DNS, the `kubernetes` Service, no way out, no way to the
kubelet), and `down` leaves the host as it found it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speculator_harness import LocalCluster, stop_recorded
from speculator_harness import node as realnode
from speculator_harness.cluster import CACHE
from speculator_harness.network import GATEWAY, drop_rule_present
from speculator_harness.process import alive
from speculator_harness.state import load_state, recover_stale_node
from speculator_harness.traces import snapshot
from speculator_operator.domain.releases import operator_image

from .conftest import node_required

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.before_cluster]

PROBE = (
    f"GATEWAY = {GATEWAY!r}\n"
    + """
import json, socket
def dial(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except OSError as exc:
        return type(exc).__name__
out = {"kubernetes": socket.gethostbyname("kubernetes.default.svc.cluster.local"),
       "api": dial("kubernetes.default.svc.cluster.local", 443), "kubelet": dial(GATEWAY, 10250),
       "outside": dial("1.1.1.1", 443)}
try:
    socket.gethostbyname("pypi.org")
    out["upstream_dns"] = "answered"
except OSError:
    out["upstream_dns"] = "none"
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
print(json.dumps(out))
"""
)


def test_a_pod_runs_on_the_real_node_and_down_leaves_no_trace(bin_dir: Path, tmp_path: Path) -> None:
    reason = realnode.unavailable(bin_dir, CACHE)
    if reason and not node_required():
        pytest.skip(f"no real node here: {reason}")
    assert not realnode.lock_holder(), "a real node is already up on this machine"
    recover_stale_node()  # the host as a killed run may have left it, put right first
    before = snapshot()
    local = LocalCluster(tmp_path / "c", bin_dir, gpu_nodes=0, real_node=True, timeout=300)
    info = local.start()
    try:
        assert info.node == "speculator-node"
        assert drop_rule_present()  # read, not provoked: nothing is sent out to prove it
        kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe"},
            "spec": {
                "nodeSelector": {"speculators.dev/real-node": "true"},
                "tolerations": [{"key": "speculators.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}],
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": operator_image(), "command": ["python", "-c", PROBE]}],
            },
        }
        subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(pod), text=True, check=True, timeout=60)
        wait = [*kubectl, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/probe", "--timeout=120s"]
        done = subprocess.run(wait, capture_output=True, text=True, timeout=150)
        logs = subprocess.run([*kubectl, "logs", "probe"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + logs.stdout + logs.stderr
        seen = json.loads(logs.stdout.strip().splitlines()[-1])
        assert seen["kubernetes"] == "10.96.0.1"  # the cluster DNS answers Service names
        assert seen["api"] == "open"  # and kube-proxy leads the `kubernetes` Service to the API server
        assert seen["upstream_dns"] == "none"  # it has no upstream
        assert seen["kubelet"] != "open"  # only the API server, on this host, talks to the kubelet
        assert seen["outside"] != "open"
        # routes to the node's pods and to the Service range only: no default route
        destinations = {line.split()[1] for line in seen["routes"]}
        assert "00000000" not in destinations
        # the kubelet pulled the pod's image from the harness's registry, on loopback
        assert info.registry is not None
        assert info.registry.startswith("127.0.0.1:")
        status = json.loads(subprocess.run([*kubectl, "get", "pod/probe", "-o", "json"], capture_output=True,
                                           text=True, check=True, timeout=60).stdout)["status"]  # fmt: skip
        ran = status["containerStatuses"][0]["imageID"]
        assert ran.endswith("@" + info.image_digests[operator_image()]), ran
    finally:
        local.stop()
    assert snapshot() == before
    # and the registry is gone with the rest: no process, nothing listening on its port
    assert not alive(info.pids["registry"])
    host, port = info.registry.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_a_detached_node_is_taken_down_from_its_state_file(bin_dir: Path, tmp_path: Path) -> None:
    """The hack/dev-cluster path: up, forget the object, down from another process."""
    reason = realnode.unavailable(bin_dir, CACHE)
    if reason and not node_required():
        pytest.skip(f"no real node here: {reason}")
    recover_stale_node()
    before = snapshot()
    local = LocalCluster(tmp_path / "c", bin_dir, gpu_nodes=0, real_node=True, timeout=300)
    info = local.start()
    assert info.node is not None
    assert realnode.lock_holder() == str(tmp_path / "c")
    # a second real node on this machine is refused, naming the first
    with pytest.raises(Exception, match="a real node already runs on this machine"):
        LocalCluster(tmp_path / "d", bin_dir, gpu_nodes=0, real_node=True).start()
    # a Deployment's pod on the node: the controller manager, still up while the node drains, replaces it
    kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
    template = _pod("sleeper", ["sleep", "3600"])
    template["spec"]["restartPolicy"] = "Always"  # type: ignore[index]
    labels = {"app": "sleeper"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sleeper"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
        },
    }
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(deployment), text=True, check=True, timeout=60)
    wait = [*kubectl, "wait", "--for=condition=Available", "deployment/sleeper", "--timeout=120s"]
    subprocess.run(wait, check=True, capture_output=True, timeout=150)

    stopped = stop_recorded(tmp_path / "c")
    for proc in local.processes.values():
        proc.popen.wait(10)  # reap our own children so they do not linger as zombies
    assert {"containerd", "kubelet", "kube-proxy", "coredns", "kube-apiserver"} <= set(stopped)
    assert snapshot() == before
    # the drain cordoned the node first: the replacement made after its delete was never bound to it
    events = [json.loads(line) for line in (tmp_path / "c" / "logs" / "audit.jsonl").read_text().splitlines()]
    pods = [e for e in events if (e.get("objectRef") or {}).get("resource") == "pods"]
    drained = min(e["requestReceivedTimestamp"] for e in pods if e["verb"] == "delete")
    after = [e for e in pods if e["requestReceivedTimestamp"] > drained]
    made = [e for e in after if e["verb"] == "create" and "subresource" not in e["objectRef"]]
    bound = [e for e in after if e["objectRef"].get("subresource") == "binding"]
    assert made, "the ReplicaSet made no replacement: the case this checks did not arise"
    assert bound == []  # the pod selects the real node only: a binding would have been to it


def _pod(name: str, command: list[str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"speculators.dev/real-node": "true"},
            "tolerations": [{"key": "speculators.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}],
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": operator_image(), "command": command}],
        },
    }


def test_a_node_killed_without_its_teardown_is_undone_by_the_next_start(bin_dir: Path, tmp_path: Path) -> None:
    """A test run killed midway, or a machine restarted under a running node: the lock file still names the
    dead cluster, nothing takes it for a running node, and the next cluster to start undoes its traces."""
    reason = realnode.unavailable(bin_dir, CACHE)
    if reason and not node_required():
        pytest.skip(f"no real node here: {reason}")
    recover_stale_node()
    before = snapshot()
    killed = tmp_path / "killed"
    argv = [sys.executable, "-m", "speculator_harness", "up", "--dir", str(killed)]
    argv += ["--bin-dir", str(bin_dir), "--real-node", "yes", "--gpu-nodes", "0", "--no-s3"]
    up = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert up.returncode == 0, up.stderr
    st = load_state(killed)
    assert st is not None
    assert st["node_record"]
    # a running pod, so that its sandbox, its mounts and its shim are among what the crash leaves
    kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", str(killed / "kubeconfig")]
    pod = _pod("sleeper", ["sleep", "3600"])
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(pod), text=True, check=True, timeout=60)
    wait = [*kubectl, "wait", "--for=condition=Ready", "pod/sleeper", "--timeout=120s"]
    subprocess.run(wait, check=True, capture_output=True, timeout=150)

    for pid in st["pids"].values():
        os.killpg(pid, signal.SIGKILL)  # each component leads its own process group
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in st["pids"].values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert drop_rule_present()  # the crash left its traces
    assert realnode.lock_holder() == ""  # but no running node
    pushed = subprocess.run(
        [sys.executable, "-m", "speculator_harness", "images", "--if-running"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "no real node runs" in pushed.stderr

    said: list[str] = []
    nxt = LocalCluster(
        tmp_path / "next", bin_dir, gpu_nodes=0, with_s3=False, real_node=True, timeout=300, log=said.append
    )
    info = nxt.start()
    try:
        assert info.node == "speculator-node"
        assert any(f"killed without its teardown ({killed})" in line for line in said), said
        assert (load_state(killed) or {}).get("node_record") is None
    finally:
        nxt.stop()
    stop_recorded(killed)  # nothing of it runs: only its state file goes
    assert snapshot() == before
