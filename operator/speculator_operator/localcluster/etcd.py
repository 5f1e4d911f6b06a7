"""etcd: the control plane's storage, on loopback with a data folder that every start wipes."""

from __future__ import annotations

import json
import shutil

from speculator_operator.localcluster.process import LOOPBACK, Supervisor, http_get


def start(sup: Supervisor) -> str:
    """Start etcd; returns its client URL."""
    data = sup.workdir / "etcd"
    shutil.rmtree(data, ignore_errors=True)  # every start is a fresh cluster: no objects from an earlier one

    def argv() -> list[str]:
        client, peer = sup.port("etcd"), sup.port("etcd-peer")
        return [
            sup.bin("etcd"),
            "--name=local",
            f"--data-dir={data}",
            f"--listen-client-urls=http://{LOOPBACK}:{client}",
            f"--advertise-client-urls=http://{LOOPBACK}:{client}",
            f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
            f"--initial-advertise-peer-urls=http://{LOOPBACK}:{peer}",
            f"--initial-cluster=local=http://{LOOPBACK}:{peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
            "--quota-backend-bytes=2147483648",
        ]

    def ready() -> bool:
        body = http_get(f"http://{LOOPBACK}:{sup.ports['etcd']}/health", None)
        return bool(json.loads(body).get("health") == "true")

    sup.launch("etcd", argv, ready)
    return f"http://{LOOPBACK}:{sup.ports['etcd']}"
