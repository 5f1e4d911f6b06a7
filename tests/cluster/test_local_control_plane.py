"""The local control plane itself: loopback only, fail fast naming the component, port retries."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from speculator_harness import ComponentError, LocalCluster, stop_recorded
from speculator_harness.cluster import free_port
from speculator_harness.network import GATEWAY

from .conftest import Cluster

pytestmark = pytest.mark.cluster


@pytest.mark.node_lane
def test_every_listener_is_on_loopback_or_the_node_gateway(cluster: Cluster) -> None:
    """Nothing listens beyond this machine: loopback, and — with the real node — the node bridge's gateway
    address, for the servers the pods must reach (API server, S3, cluster DNS) and the kubelet (which
    the node's nft table keeps the pods off)."""
    if cluster.local is None:
        pytest.skip("the cluster under test came from KUBECONFIG; its processes are not ours")
    seen: dict[str, list[str]] = {}
    for name, pid in cluster.local.pids.items():
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for proc in procs:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN or (conn.type == socket.SOCK_DGRAM and not conn.raddr):
                    seen.setdefault(name, []).append(f"{conn.laddr.ip}:{conn.laddr.port}")
    assert set(seen) >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "s3"}
    allowed = {"127.0.0.1"}
    if cluster.local.node:
        assert set(seen) >= {"containerd", "kubelet", "kube-proxy", "coredns"}
        allowed.add(GATEWAY)
        assert {a.rsplit(":", 1)[0] for a in seen["coredns"]} == {"127.0.0.1", GATEWAY}
    outside = {name: addrs for name, addrs in seen.items() if any(a.rsplit(":", 1)[0] not in allowed for a in addrs)}
    assert outside == {}


def _linked_bins(real: Path, tmp: Path, replace: dict[str, str]) -> Path:
    """A bin folder of links to the real binaries, with some replaced by scripts."""
    bins = tmp / "bin"
    bins.mkdir()
    for binary in real.iterdir():
        (bins / binary.name).symlink_to(binary.resolve())
    for name, script in replace.items():
        (bins / name).unlink()
        (bins / name).write_text("#!/bin/sh\n" + script)
        (bins / name).chmod(0o755)
    return bins


def test_a_dying_component_fails_fast_with_its_name_and_log(bin_dir: Path, tmp_path: Path) -> None:
    bins = _linked_bins(
        bin_dir, tmp_path, {"kube-apiserver": "echo 'E1129 fatal: storage backend exploded' >&2\nexit 7\n"}
    )
    local = LocalCluster(tmp_path / "c", bins, with_s3=False, timeout=300)
    with pytest.raises(ComponentError) as err:
        local.start()
    assert err.value.component == "kube-apiserver"
    # it did not wait for the timeout: it saw the exit
    assert err.value.problem == "exited with code 7 while starting"
    assert "storage backend exploded" in err.value.log_tail
    # what had started (etcd) was stopped again
    assert local.processes == {}


def test_a_taken_port_is_retried_on_another(bin_dir: Path, tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    picks = iter([taken])

    def picker() -> int:
        return next(picks, None) or free_port()

    bins = _linked_bins(bin_dir, tmp_path, {"kube-apiserver": "echo 'stop here' >&2\nexit 3\n"})
    local = LocalCluster(tmp_path / "c", bins, with_s3=False, port_picker=picker)
    try:
        with pytest.raises(ComponentError) as err:
            local.start()
    finally:
        blocker.close()
    assert err.value.component == "kube-apiserver"
    assert local.ports["etcd"] != taken
    etcd_log = (tmp_path / "c" / "logs" / "etcd.log").read_text()
    assert "address already in use" in etcd_log  # the first try lost the port, the second came up
    assert local.durations.get("etcd") is not None


def test_detached_cluster_is_stopped_from_its_state_file(bin_dir: Path, tmp_path: Path) -> None:
    # the hack/dev-cluster path: start, forget the object, stop from the recorded state
    local = LocalCluster(tmp_path / "c", bin_dir, gpu_nodes=1, with_s3=True)
    info = local.start()
    pids = dict(info.pids)
    assert all(psutil.pid_exists(pid) for pid in pids.values())
    stopped = stop_recorded(tmp_path / "c")
    assert set(stopped) == set(pids)
    for proc in local.processes.values():
        proc.popen.wait(10)  # reap our own children so they do not linger as zombies
    assert not any(psutil.pid_exists(pid) for pid in pids.values())
