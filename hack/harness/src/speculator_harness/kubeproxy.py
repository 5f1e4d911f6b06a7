"""kube-proxy of the real node, in nftables mode: Services answered on this host and in the node's pods.
It is told to leave the host's conntrack settings alone; its own nft tables are removed by `down`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from speculator_harness.kubelet import NODE_NAME
from speculator_harness.network import GATEWAY, NODE_CIDR
from speculator_harness.process import LOOPBACK, Process, Supervisor, http_get

METRICS_PORT = 10249
HEALTHZ_PORT = 10256
TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))


def start(sup: Supervisor, kubeconfig: Path) -> Process:
    argv = [
        sup.bin("kube-proxy"),
        f"--kubeconfig={kubeconfig}",
        "--proxy-mode=nftables",
        f"--cluster-cidr={NODE_CIDR}",
        f"--hostname-override={NODE_NAME}",
        f"--metrics-bind-address={LOOPBACK}:{METRICS_PORT}",
        f"--healthz-bind-address={LOOPBACK}:{HEALTHZ_PORT}",
        f"--nodeport-addresses={GATEWAY}/32",
        # leave the host's conntrack sysctls as they are
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--v=1",
    ]

    def ready() -> bool:
        http_get(f"http://{LOOPBACK}:{HEALTHZ_PORT}/healthz", None)  # 200 once its rules are synced
        return True

    return sup.launch("kube-proxy", lambda: argv, ready)


def remove_tables() -> list[str]:
    removed = []
    for family, table in TABLES:
        done = subprocess.run(["nft", "delete", "table", family, table], capture_output=True, check=False)
        if done.returncode == 0:
            removed.append(f"{family} {table}")
    return removed
