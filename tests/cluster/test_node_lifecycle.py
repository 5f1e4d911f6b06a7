"""The real node's own life, before the session's cluster takes the machine's one node: a pod runs on it
with the network the harness made (cluster DNS, the `kubernetes` Service, no way out, no way to the
kubelet), and `down` leaves the host as it found it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from speculator_operator.localcluster import LocalCluster, stop_recorded
from speculator_operator.localcluster import node as realnode
from speculator_operator.localcluster.cluster import CACHE
from speculator_operator.localcluster.network import GATEWAY, drop_rule_present
from speculator_operator.localcluster.traces import snapshot
from speculator_operator.releases import operator_image

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
    finally:
        local.stop()
    assert snapshot() == before


def test_a_detached_node_is_taken_down_from_its_state_file(bin_dir: Path, tmp_path: Path) -> None:
    """The hack/dev-cluster path: up, forget the object, down from another process."""
    reason = realnode.unavailable(bin_dir, CACHE)
    if reason and not node_required():
        pytest.skip(f"no real node here: {reason}")
    before = snapshot()
    local = LocalCluster(tmp_path / "c", bin_dir, gpu_nodes=0, real_node=True, timeout=300)
    info = local.start()
    assert info.node is not None
    assert realnode.lock_holder() == str(tmp_path / "c")
    # a second real node on this machine is refused, naming the first
    with pytest.raises(Exception, match="a real node already runs on this machine"):
        LocalCluster(tmp_path / "d", bin_dir, gpu_nodes=0, real_node=True).start()
    stopped = stop_recorded(tmp_path / "c")
    for proc in local.processes.values():
        proc.popen.wait(10)  # reap our own children so they do not linger as zombies
    assert {"containerd", "kubelet", "kube-proxy", "coredns", "kube-apiserver"} <= set(stopped)
    assert snapshot() == before
