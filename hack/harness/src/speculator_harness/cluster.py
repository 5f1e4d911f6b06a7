"""Start and stop the local cluster as supervised processes.

Order: [the real node's lock and bridge network] -> etcd -> kube-apiserver (until /readyz) ->
kube-controller-manager + kube-scheduler -> kwok -> the S3 server -> fake nodes -> [the real node: the image
registry (the built images pushed), containerd, the kubelet, the cluster DNS, kube-proxy] -> every node
Ready and the `default` ServiceAccount (proof that the controllers run). Every listener is on 127.0.0.1 with
a port picked free, except the API server, the S3 server and the DNS, which listen on the node bridge's
gateway address when the real node runs (the host and the pods reach that one address). A component that
exits while we wait for it fails the start at once, naming it with the tail of its log; one that lost a race
for its port is restarted on another port (process.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speculator_harness import apiserver, controllers, etcd, kwok, lws, network, s3, state
from speculator_harness import node as realnode
from speculator_harness.apiserver import SERVICE_CIDR, Api, write_kubeconfig
from speculator_harness.kubelet import NODE_NAME
from speculator_harness.kwok import DEFAULT_GPU_PRODUCT, FAKE_NODE_ANNOTATION, GPU_RESOURCE, GPU_TAINT
from speculator_harness.pki import write_pki
from speculator_harness.process import (
    LOOPBACK,
    ComponentError,
    Supervisor,
    free_port,
    tail,
)
from speculator_harness.s3 import S3Info
from speculator_harness.state import STATE_FILE, load_state, running_components, stop_recorded
from speculator_operator.domain.releases import DIGESTS_ENV

CACHE = Path(os.environ.get("SPECULATOR_OPERATOR_CACHE") or Path.home() / ".cache" / "speculator-operator")

__all__ = [
    "DEFAULT_GPU_PRODUCT",
    "FAKE_NODE_ANNOTATION",
    "GPU_RESOURCE",
    "GPU_TAINT",
    "LOOPBACK",
    "STATE_FILE",
    "ClusterInfo",
    "ComponentError",
    "LocalCluster",
    "S3Info",
    "free_port",
    "load_state",
    "running_components",
    "stop_recorded",
    "tail",
]


@dataclass
class ClusterInfo:
    kubeconfig: Path
    server: str
    bin_dir: Path
    s3: S3Info | None
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    startup_seconds: dict[str, float] = field(default_factory=dict)
    audit_log: Path | None = None  # the API server's audit log (writes, and reads of our kinds)
    node: str | None = None  # the real node's name, when one runs
    node_unavailable: str | None = None  # why no real node runs (when one was wanted)
    address: str = LOOPBACK  # where the API server, S3 and the DNS listen
    registry: str | None = None  # host:port of the real node's image registry (loopback)
    image_digests: dict[str, str] = field(default_factory=dict)  # built reference -> manifest digest pushed

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    def env(self) -> dict[str, str]:
        env = {"KUBECONFIG": str(self.kubeconfig), "SPECULATOR_SCRAPE_NETWORKS": scrape_networks(self.node)}
        if self.s3:
            env.update(self.s3.env())
        if self.image_digests:
            env[DIGESTS_ENV] = json.dumps(self.image_digests, sort_keys=True)
        return env


def scrape_networks(node: str | None) -> str:
    """Where an operator of this cluster may dial a serving pod's /metrics: this machine's own addresses
    (kwok pods a test placed in 127.0.0.0/8, the real node's pods), never kwok's fake pod range."""
    return "127.0.0.0/8" + (f",{network.NODE_CIDR}" if node else "")


class LocalCluster(Supervisor):
    """A local cluster rooted in `workdir`, using the binaries in `bin_dir`.

    `start()` returns a ClusterInfo; `stop()` ends every process it started and undoes the real node's
    traces (also after a failed start). `detach=True` leaves the processes running when this Python
    process exits (the `hack/dev-cluster` case); `stop_recorded(workdir)` ends them later from another
    process. `real_node`: True starts one (failing if it cannot), None starts one where it can (and says
    why not otherwise), False never does.
    """

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        gpu_nodes: int = 2,
        gpus_per_node: int = 8,
        gpu_product: str = DEFAULT_GPU_PRODUCT,
        cpu_nodes: int = 1,
        with_s3: bool = True,
        real_node: bool | None = False,
        timeout: float = 120.0,
        log: Callable[[str], None] | None = None,
        port_picker: Callable[[], int] = free_port,
        cache: Path = CACHE,
    ) -> None:
        super().__init__(workdir, bin_dir, timeout=timeout, log=log, port_picker=port_picker)
        self.gpu_nodes = gpu_nodes
        self.gpus_per_node = gpus_per_node
        self.gpu_product = gpu_product
        self.cpu_nodes = cpu_nodes
        self.with_s3 = with_s3
        self.real_node = real_node
        self.cache = cache
        self.info: ClusterInfo | None = None
        self.etcd_url: str | None = None
        self.api: Api | None = None
        self._node: realnode.Prepared | None = None

    # ---------------------------------------------------------------- public

    def start(self) -> ClusterInfo:
        t0 = time.monotonic()
        unavailable = None
        try:
            self._check_binaries()
            self.workdir.mkdir(parents=True, exist_ok=True)
            (self.workdir / "logs").mkdir(exist_ok=True)
            unavailable = self._prepare_node()
            if self._node:
                self._record_state(None)  # from here on a killed start leaves a record of what to undo
            address = network.GATEWAY if self._node else LOOPBACK
            pki = write_pki(self.workdir / "pki", (address,), NODE_NAME if self._node else None)
            etcd_url = self.etcd_url = etcd.start(self)
            self.api = apiserver.start(self, pki, etcd_url, address, publish_endpoint=self._node is not None)
            write_kubeconfig(self.kubeconfig, self.api.server, pki)
            controllers.start(self, self.kubeconfig, self.workdir / "pki")
            kwok.start(self, self.kubeconfig)
            s3_info = s3.start(self, address) if self.with_s3 else None
            kwok.create_nodes(self.api, self.fake_node_names(), self.gpus_per_node, self.gpu_product)
            if self._node:
                self._record_state(None)
                realnode.start(
                    self, self._node, pki, self.api, self.cache, SERVICE_CIDR, lambda: self._record_state(None)
                )
            self._wait_cluster_ready()
        except BaseException:
            self.stop()
            raise
        self.durations["total"] = time.monotonic() - t0
        self.info = ClusterInfo(
            kubeconfig=self.kubeconfig,
            server=self.api.server,
            bin_dir=self.bin_dir,
            s3=s3_info,
            pids={name: p.pid for name, p in self.processes.items()},
            ports=dict(self.ports),
            startup_seconds={k: round(v, 2) for k, v in self.durations.items()},
            audit_log=apiserver.audit_log(self.workdir),
            node=NODE_NAME if self._node else None,
            node_unavailable=unavailable,
            address=address,
            registry=self._node.registry if self._node else None,
            image_digests=dict(self._node.digests) if self._node else {},
        )
        self._record_state(self.info)
        return self.info

    def install_lws(self) -> None:
        """LeaderWorkerSet's CRDs, controller and webhooks into this running cluster (lws.py); a second call finds
        them there."""
        assert self.api is not None, "start() first"
        if "lws-manager" in self.processes:
            return
        lws.install(self, self.api, self.kubeconfig, self.workdir / "pki")
        if self.info is not None:
            self.info.pids["lws-manager"] = self.processes["lws-manager"].pid
            self.info.ports = dict(self.ports)
            self._record_state(self.info)

    def start_s3_only(self) -> S3Info:
        """Just the S3 server (benchmarks and tools that need no Kubernetes); stop() ends it."""
        path = self.bin_dir / "versitygw"
        if not os.access(path, os.X_OK):
            raise ComponentError("s3", f"binary not found at {path} (run hack/build-kube)")
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            return s3.start(self, LOOPBACK)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._node is not None:
            rec = realnode.record(self._node)
            done = realnode.teardown(self.workdir, rec, self.api, self._stop_one)
            self.say(f"local-cluster: real node down ({len(done)} trace(s) undone)")
            with contextlib.suppress(OSError):
                os.close(self._node.lock_fd)
            self._node = None
        self.stop_all()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / STATE_FILE).unlink()

    # ----------------------------------------------------------- components

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def fake_node_names(self) -> list[str]:
        return kwok.node_names(self.cpu_nodes, self.gpu_nodes)

    def node_names(self) -> list[str]:
        return self.fake_node_names() + ([NODE_NAME] if self._node else [])

    def restart_apiserver(self, down_seconds: float = 0.0, compact: bool = False) -> int | None:
        """A fault for the tests: stop the API server in place, optionally compact etcd's history while it
        is down (so that watches resume from an expired resource version: 410 Gone), wait, start it again
        on the same address and port. Returns the revision compacted at, if any."""
        self.stop_component("kube-apiserver")
        compacted = etcd.compact(self.etcd_url) if compact and self.etcd_url else None
        if down_seconds:
            time.sleep(down_seconds)  # the outage itself: what the fault is
        self.start_component("kube-apiserver")
        if self.info is not None:
            self.info.pids["kube-apiserver"] = self.processes["kube-apiserver"].pid
            self._record_state(self.info)
        return compacted

    def _stop_one(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def _check_binaries(self) -> None:
        needed = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        if self.with_s3:
            needed.append("versitygw")
        for name in needed:
            path = self.bin_dir / name
            if not (path.exists() and os.access(path, os.X_OK)):
                raise ComponentError(name, f"binary not found at {path} (run hack/build-kube)")

    def _prepare_node(self) -> str | None:
        """Take the machine's node lock and make its network, where a node is wanted and can run; returns
        why not otherwise."""
        if self.real_node is False:
            return None
        reason = realnode.unavailable(self.bin_dir, self.cache)
        if reason is None:
            stale, undone = state.recover_stale_node()
            if stale:
                self.say(f"local-cluster: undid a real node killed without its teardown ({stale}): {', '.join(undone)}")
            try:
                self._node = realnode.prepare(self.workdir, SERVICE_CIDR)
            except realnode.NodeUnavailable as exc:
                reason = str(exc)
        if reason is not None:
            if self.real_node:
                raise ComponentError("real-node", reason)
            self.say(f"local-cluster: no real node: {reason}")
        return reason

    def _wait_cluster_ready(self) -> None:
        assert self.api is not None
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        names = set(self.node_names())
        waiting_for = "nodes"
        while time.monotonic() < deadline:
            self.check_running()
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                if waiting_for == "nodes":
                    nodes = self.api.call("GET", "/api/v1/nodes")["items"]
                    ready = {n["metadata"]["name"] for n in nodes if _node_ready(n)}
                    if names <= ready:
                        self.durations["nodes"] = time.monotonic() - t0
                        self.say(f"local-cluster: {len(names)} nodes Ready in {self.durations['nodes']:.1f} s")
                        waiting_for = "serviceaccount"
                if waiting_for == "serviceaccount":
                    self.api.call("GET", "/api/v1/namespaces/default/serviceaccounts/default")
                    return
            time.sleep(0.25)
        culprit = "kwok" if waiting_for == "nodes" else "kube-controller-manager"
        raise ComponentError(
            culprit,
            f"cluster not ready within {self.timeout:.0f} s (waiting for {waiting_for})",
            tail(self.processes[culprit].log),
        )

    # ---------------------------------------------------------------- state

    def _record_state(self, info: ClusterInfo | None) -> None:
        """What `stop_recorded` needs from another process: pids, binaries, the real node's undo record (also
        while a start is under way, so that a start killed midway can be taken down)."""
        data: dict[str, Any] = asdict(info) if info is not None else {"kubeconfig": str(self.kubeconfig)}
        data["pids"] = {name: p.pid for name, p in self.processes.items()}
        data["argv"] = {name: p.argv[0] for name, p in self.processes.items()}
        if self.api is not None:
            data["server"] = self.api.server
        if self._node is not None:
            data["node_record"] = realnode.record(self._node)
        state.write(self.workdir, data)


def _node_ready(node: dict[str, Any]) -> bool:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions", [])
    )
    tainted = any(
        t.get("key", "").startswith("node.kubernetes.io/") for t in node.get("spec", {}).get("taints", []) or []
    )
    return ready and not tainted
