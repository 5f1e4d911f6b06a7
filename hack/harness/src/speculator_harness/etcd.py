"""etcd: the control plane's storage, on loopback with a data folder that every start wipes."""

from __future__ import annotations

import base64
import json
import shutil
import urllib.request
from typing import Any

from speculator_harness.process import LOOPBACK, Supervisor, http_get


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


def revision(url: str) -> int:
    """etcd's current revision (its JSON gateway: no etcdctl needed)."""
    body = _post(url, "/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1})
    return int(body["header"]["revision"])


def compact(url: str) -> int:
    """Compact etcd's history up to its current revision; every older resource version is gone (a watch
    resumed from one gets 410 Gone). Returns the revision compacted at."""
    rev = revision(url)
    _post(url, "/v3/kv/compaction", {"revision": rev, "physical": True})
    return rev


def _post(url: str, path: str, body: dict[str, object]) -> dict[str, Any]:
    req = urllib.request.Request(  # noqa: S310 (http to etcd on loopback)
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (etcd on loopback)
        result: dict[str, Any] = json.loads(resp.read())
        return result
