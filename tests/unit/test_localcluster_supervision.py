"""Supervision logic of the local control plane with stand-in binaries (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speculator_harness import ComponentError, LocalCluster
from speculator_harness.cluster import tail

NAMES = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "versitygw"]


def fake_bins(tmp_path: Path, scripts: dict[str, str]) -> Path:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in NAMES:
        path = bins / name
        path.write_text("#!/bin/sh\n" + scripts.get(name, "sleep 600\n"))
        path.chmod(0o755)
    return bins


def test_missing_binary_is_named(tmp_path: Path) -> None:
    bins = fake_bins(tmp_path, {})
    (bins / "kwok").unlink()
    with pytest.raises(ComponentError) as err:
        LocalCluster(tmp_path / "c", bins).start()
    assert err.value.component == "kwok"
    assert "hack/build-kube" in str(err.value)


def test_component_exiting_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    bins = fake_bins(tmp_path, {"etcd": "echo 'etcdmain: member dir is corrupt' >&2\nexit 3\n"})
    local = LocalCluster(tmp_path / "c", bins, timeout=300)
    with pytest.raises(ComponentError) as err:
        local.start()
    assert err.value.component == "etcd"
    assert err.value.problem == "exited with code 3 while starting"
    assert "member dir is corrupt" in err.value.log_tail
    assert "etcd: exited with code 3" in str(err.value)


def test_component_that_never_gets_ready_times_out_and_is_stopped(tmp_path: Path) -> None:
    # a stand-in etcd that runs but never answers its health endpoint
    bins = fake_bins(tmp_path, {"etcd": "echo waiting\nexec sleep 600\n"})
    local = LocalCluster(tmp_path / "c", bins, timeout=1.5)
    with pytest.raises(ComponentError) as err:
        local.start()
    assert err.value.component == "etcd"
    assert err.value.problem == "not ready within 2 s"
    assert "waiting" in err.value.log_tail
    assert local.processes == {}


def test_port_in_use_is_retried_then_reported(tmp_path: Path) -> None:
    bins = fake_bins(tmp_path, {"etcd": "echo 'listen tcp 127.0.0.1:1234: bind: address already in use' >&2\nexit 1\n"})
    local = LocalCluster(tmp_path / "c", bins, timeout=300)
    with pytest.raises(ComponentError) as err:
        local.start()
    assert err.value.component == "etcd"
    log = (tmp_path / "c" / "logs" / "etcd.log").read_text()
    assert log.count("=== ") == 3  # three attempts, each on a fresh port


def test_tail_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert tail(tmp_path / "nope.log") == ""


def test_an_operator_of_the_local_cluster_never_dials_kwoks_fake_pod_range() -> None:
    import ipaddress

    from speculator_harness.cluster import scrape_networks
    from speculator_harness.kwok import FAKE_POD_CIDR
    from speculator_harness.network import NODE_CIDR

    fake = ipaddress.ip_network(FAKE_POD_CIDR)
    for node in (None, "speculator-node"):
        networks = [ipaddress.ip_network(n) for n in scrape_networks(node).split(",")]
        assert not any(n.overlaps(fake) for n in networks)
        assert all(n.subnet_of(ipaddress.ip_network("127.0.0.0/8")) or n == ipaddress.ip_network(NODE_CIDR)
                   for n in networks)  # fmt: skip
    assert NODE_CIDR in scrape_networks("speculator-node")
    assert NODE_CIDR not in scrape_networks(None)
