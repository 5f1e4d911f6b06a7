"""The kubelet of the real node (built by hack/build-kube at the control plane's version), with the
settings this sandbox needs (docs/development/real-node.md §2): `oomScoreAdj: 0`, cgroupfs on cgroup v1,
no iptables chains of its own, eviction and image GC off. Its API listens on the bridge's gateway
address, the node's InternalIP, where the API server reaches it for logs, exec and port-forward (a
loopback node address is refused); the node's pods are kept off that port by the harness's nft table
(network.py). Health on loopback. The node is tainted,
so only pods meant for it (tolerating the taint) land there; the cluster DNS is the bridge's gateway and
its resolv.conf has no upstream, so no query leaves the machine."""

from __future__ import annotations

import json
from pathlib import Path

from speculator_harness.network import GATEWAY
from speculator_harness.process import LOOPBACK, Process, Supervisor, http_get

NODE_NAME = "speculator-node"
NODE_LABEL = "speculators.dev/real-node"
TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
PORT = 10250
HEALTHZ_PORT = 10248


def root_dir(workdir: Path) -> Path:
    return workdir / "kubelet"


def config(workdir: Path, ca: Path, dns: str, runtime_socket: Path) -> Path:
    root = root_dir(workdir)
    root.mkdir(parents=True, exist_ok=True)
    resolv = workdir / "resolv.conf"
    resolv.write_text("# the cluster DNS only (clusterDNS below); no upstream: no query leaves this machine\n")
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": GATEWAY,
        "port": PORT,
        "healthzBindAddress": LOOPBACK,
        "healthzPort": HEALTHZ_PORT,
        "readOnlyPort": 0,
        # the API server has no kubelet client certificate here; only the host reaches this port
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "makeIPTablesUtilChains": False,
        "clusterDNS": [dns],
        "clusterDomain": "cluster.local",
        "resolvConf": str(resolv),
        "podLogsDir": str(workdir / "pod-logs"),
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "registerWithTaints": [TAINT],
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "serializeImagePulls": False,
        "maxPods": 50,
        "nodeStatusReportFrequency": "10s",
    }
    path = workdir / "kubelet-config.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def start(sup: Supervisor, kubeconfig: Path, ca: Path, dns: str, runtime_socket: Path) -> Process:
    path = config(sup.workdir, ca, dns, runtime_socket)
    argv = [
        sup.bin("kubelet"),
        f"--config={path}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root_dir(sup.workdir)}",
        f"--cert-dir={sup.workdir / 'kubelet-pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={GATEWAY}",
        f"--node-labels={NODE_LABEL}=true",
        "--v=1",
    ]

    def ready() -> bool:
        return http_get(f"http://{LOOPBACK}:{HEALTHZ_PORT}/healthz", None).strip() == "ok"

    return sup.launch("kubelet", lambda: argv, ready)
