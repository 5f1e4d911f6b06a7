"""Start and stop the local control plane as supervised processes.

Order: etcd -> kube-apiserver (until /readyz) -> kube-controller-manager + kube-scheduler -> kwok ->
fake nodes (until Ready and untainted) -> the `default` ServiceAccount (proof that the controllers
run); the S3 server starts beside them. Every listener is on 127.0.0.1 with a port picked free; a
component that exits while we wait for it fails the start at once, naming the component with the
tail of its log, and one that lost a race for its port is restarted on another port.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from speculator_operator.localcluster.pki import write_pki

LOOPBACK = "127.0.0.1"
PORT_RETRIES = 3
STATE_FILE = "state.json"
# Fake GPU nodes: what the NVIDIA device plugin and GPU feature discovery would publish.
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
PORT_IN_USE_MARKERS = ("address already in use", "bind: address in use")


class ComponentError(RuntimeError):
    """A component of the local cluster did not start; names it and carries its log tail."""

    def __init__(self, component: str, problem: str, log_tail: str = "") -> None:
        self.component = component
        self.problem = problem
        self.log_tail = log_tail
        text = f"{component}: {problem}"
        if log_tail:
            text += f"\n--- last lines of the {component} log ---\n{log_tail}"
        super().__init__(text)


@dataclass
class S3Info:
    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that boto3 (and the operator) read."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }


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

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    def env(self) -> dict[str, str]:
        env = {"KUBECONFIG": str(self.kubeconfig)}
        if self.s3:
            env.update(self.s3.env())
        return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-64_000:]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class _Process:
    """One supervised component: its own process group, its own log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        with log.open("ab") as out:
            out.write(f"\n=== {' '.join(argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> int | None:
        return self.popen.poll()

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        else:
            # the leader is gone, but a child it left behind may not be
            _signal_group(self.popen.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class LocalCluster:
    """A local control plane rooted in `workdir`, using the binaries in `bin_dir`.

    `start()` returns a ClusterInfo; `stop()` ends every process it started (also after a failed
    start). `detach=True` leaves the processes running when this Python process exits (the
    `hack/dev-cluster` case); `stop_recorded(workdir)` ends them later from another process.
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
        timeout: float = 120.0,
        log: Callable[[str], None] | None = None,
        port_picker: Callable[[], int] = free_port,
    ) -> None:
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.gpu_nodes = gpu_nodes
        self.gpus_per_node = gpus_per_node
        self.gpu_product = gpu_product
        self.cpu_nodes = cpu_nodes
        self.with_s3 = with_s3
        self.timeout = timeout
        self.say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.port_picker = port_picker
        self.processes: dict[str, _Process] = {}
        self.ports: dict[str, int] = {}
        self.durations: dict[str, float] = {}
        self._ssl: ssl.SSLContext | None = None
        self.info: ClusterInfo | None = None

    # ---------------------------------------------------------------- public

    def start(self) -> ClusterInfo:
        t0 = time.monotonic()
        try:
            self._check_binaries()
            self.workdir.mkdir(parents=True, exist_ok=True)
            for old in ("etcd", "s3"):  # every start is a fresh cluster: no objects from an earlier one
                shutil.rmtree(self.workdir / old, ignore_errors=True)
            (self.workdir / "logs").mkdir(exist_ok=True)
            pki = write_pki(self.workdir / "pki")
            self._start_etcd()
            self._start_apiserver(pki)
            self._write_kubeconfig(pki)
            self._start_controllers()
            self._start_kwok()
            s3 = self._start_s3() if self.with_s3 else None
            self._create_nodes()
            self._wait_cluster_ready()
        except BaseException:
            self.stop()
            raise
        self.durations["total"] = time.monotonic() - t0
        self.info = ClusterInfo(
            kubeconfig=self.kubeconfig,
            server=self.server,
            bin_dir=self.bin_dir,
            s3=s3,
            pids={name: p.pid for name, p in self.processes.items()},
            ports=dict(self.ports),
            startup_seconds={k: round(v, 2) for k, v in self.durations.items()},
            audit_log=self.audit_log,
        )
        self._record_state()
        return self.info

    def start_s3_only(self) -> S3Info:
        """Just the S3 server (benchmarks and tools that need no Kubernetes); stop() ends it."""
        path = self.bin_dir / "versitygw"
        if not os.access(path, os.X_OK):
            raise ComponentError("s3", f"binary not found at {path} (run hack/build-kube)")
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            return self._start_s3()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        self.processes.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / STATE_FILE).unlink()

    # ----------------------------------------------------------- components

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.ports['kube-apiserver']}"

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _check_binaries(self) -> None:
        needed = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        if self.with_s3:
            needed.append("versitygw")
        for name in needed:
            path = self.bin_dir / name
            if not (path.exists() and os.access(path, os.X_OK)):
                raise ComponentError(name, f"binary not found at {path} (run hack/build-kube)")

    def _launch(
        self,
        name: str,
        make_argv: Callable[[], list[str]],
        ready: Callable[[], bool],
        env: dict[str, str] | None = None,
    ) -> None:
        """Start `name` and wait until `ready()`; retry on another port if it lost its port."""
        log = self.workdir / "logs" / f"{name}.log"
        t0 = time.monotonic()
        for attempt in range(1, PORT_RETRIES + 1):
            proc = _Process(name, make_argv(), log, env)
            self.processes[name] = proc
            outcome = self._wait(name, proc, ready)
            if outcome == "ready":
                self.durations[name] = time.monotonic() - t0
                self.say(f"local-cluster: {name} ready in {self.durations[name]:.1f} s")
                return
            text = tail(log, 60).lower()
            if any(marker in text for marker in PORT_IN_USE_MARKERS) and attempt < PORT_RETRIES:
                self.say(f"local-cluster: {name} lost its port to another process; retrying on a new one")
                proc.stop()
                continue
            raise ComponentError(name, f"exited with code {proc.exited()} while starting", tail(log))
        raise AssertionError("unreachable")

    def _wait(self, name: str, proc: _Process, ready: Callable[[], bool]) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if proc.exited() is not None:
                return "exited"
            try:
                if ready():
                    return "ready"
            except (OSError, ValueError, ssl.SSLError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise ComponentError(name, f"not ready within {self.timeout:.0f} s", tail(proc.log))

    def _port(self, name: str) -> int:
        self.ports[name] = self.port_picker()
        return self.ports[name]

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd"

        def argv() -> list[str]:
            client, peer = self._port("etcd"), self._port("etcd-peer")
            return [
                self._bin("etcd"),
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
            body = _http_get(f"http://{LOOPBACK}:{self.ports['etcd']}/health", None)
            return bool(json.loads(body).get("health") == "true")

        self._launch("etcd", argv, ready)

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def _start_apiserver(self, pki: dict[str, Path]) -> None:
        # an audit log of every write (and of reads of our own kinds), so tests can count API requests
        policy = self.workdir / "audit-policy.yaml"
        rules = [
            {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
            {"level": "Metadata", "resources": [{"group": "speculators.dev"}]},
            {"level": "None"},
        ]
        audit_policy = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"]}
        policy.write_text(json.dumps({**audit_policy, "rules": rules}))
        ctx = ssl.create_default_context(cafile=str(pki["ca.crt"]))
        ctx.load_cert_chain(str(pki["admin.crt"]), str(pki["admin.key"]))
        self._ssl = ctx

        def argv() -> list[str]:
            port = self._port("kube-apiserver")
            return [
                self._bin("kube-apiserver"),
                f"--etcd-servers=http://{LOOPBACK}:{self.ports['etcd']}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--advertise-address={LOOPBACK}",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--tls-cert-file={pki['apiserver.crt']}",
                f"--tls-private-key-file={pki['apiserver.key']}",
                f"--client-ca-file={pki['ca.crt']}",
                "--service-cluster-ip-range=10.96.0.0/16",  # room for thousands of Services (data only)
                f"--service-account-issuer=https://{LOOPBACK}:{port}",
                f"--service-account-key-file={pki['sa.pub']}",
                f"--service-account-signing-key-file={pki['sa.key']}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxsize=200",
            ]

        def ready() -> bool:
            return _http_get(f"{self.server}/readyz", self._ssl).strip() == "ok"

        self._launch("kube-apiserver", argv, ready)

    def _write_kubeconfig(self, pki: dict[str, Path]) -> None:
        def b64(name: str) -> str:
            return base64.b64encode(pki[name].read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "speculator-local",
                    "cluster": {"server": self.server, "certificate-authority-data": b64("ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "speculator-local-admin",
                    "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")},
                }
            ],
            "contexts": [
                {
                    "name": "speculator-local",
                    "context": {
                        "cluster": "speculator-local",
                        "user": "speculator-local-admin",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "speculator-local",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))
        self.kubeconfig.chmod(0o600)

    def _start_controllers(self) -> None:
        kc = str(self.kubeconfig)
        pki = self.workdir / "pki"
        common = [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={LOOPBACK}",
            "--leader-elect=false",
        ]

        def kcm_argv() -> list[str]:
            return [
                self._bin("kube-controller-manager"),
                *common,
                f"--secure-port={self._port('kube-controller-manager')}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--profiling=false",
            ]

        def sched_argv() -> list[str]:
            return [
                self._bin("kube-scheduler"),
                *common,
                f"--secure-port={self._port('kube-scheduler')}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--profiling=false",
            ]

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their serving certs are self-signed; we only ask /healthz

        def healthy(name: str) -> Callable[[], bool]:
            return lambda: _http_get(f"https://{LOOPBACK}:{self.ports[name]}/healthz", insecure) == "ok"

        self._launch("kube-controller-manager", kcm_argv, healthy("kube-controller-manager"))
        self._launch("kube-scheduler", sched_argv, healthy("kube-scheduler"))

    def _start_kwok(self) -> None:
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(resources.files(__package__).joinpath("kwok-stages.yaml").read_text())
        key, value = FAKE_NODE_ANNOTATION

        def argv() -> list[str]:
            return [
                self._bin("kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--server-address={LOOPBACK}:{self._port('kwok')}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.2",
            ]

        def ready() -> bool:
            return _http_get(f"http://{LOOPBACK}:{self.ports['kwok']}/healthz", None).strip() == "ok"

        self._launch("kwok", argv, ready)

    def _start_s3(self) -> S3Info:
        creds = {"ROOT_ACCESS_KEY": "speculator-local", "ROOT_SECRET_KEY": "speculator-local-secret"}
        root = self.workdir / "s3"
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "meta").mkdir(parents=True, exist_ok=True)

        def argv() -> list[str]:
            return [
                self._bin("versitygw"),
                f"--port={LOOPBACK}:{self._port('s3')}",
                "posix",
                f"--sidecar={root / 'meta'}",
                str(root / "data"),
            ]

        def ready() -> bool:
            with socket.create_connection((LOOPBACK, self.ports["s3"]), timeout=1):
                return True

        self._launch("s3", argv, ready, env=creds)
        return S3Info(
            endpoint=f"http://{LOOPBACK}:{self.ports['s3']}",
            access_key=creds["ROOT_ACCESS_KEY"],
            secret_key=creds["ROOT_SECRET_KEY"],
        )

    # ---------------------------------------------------------------- nodes

    def _node(self, name: str, gpus: int) -> dict[str, Any]:
        key, value = FAKE_NODE_ANNOTATION
        resources_ = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "2Ti"}
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
        }
        spec: dict[str, Any] = {}
        if gpus:
            resources_[GPU_RESOURCE] = str(gpus)
            labels.update(
                {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": self.gpu_product,
                    "nvidia.com/gpu.count": str(gpus),
                }
            )
            spec["taints"] = [GPU_TAINT]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
            "status": {"allocatable": resources_, "capacity": resources_},
        }

    def node_names(self) -> list[str]:
        return [f"kwok-cpu-{i}" for i in range(self.cpu_nodes)] + [f"kwok-gpu-{i}" for i in range(self.gpu_nodes)]

    def _create_nodes(self) -> None:
        for name in self.node_names():
            gpus = self.gpus_per_node if name.startswith("kwok-gpu") else 0
            body = self._node(name, gpus)
            try:
                self._api("POST", "/api/v1/nodes", body)
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise ComponentError("kube-apiserver", f"creating node {name}: {exc}") from exc

    def _wait_cluster_ready(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        names = set(self.node_names())
        waiting_for = "nodes"
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.exited() is not None:
                    raise ComponentError(name, f"exited with code {proc.exited()}", tail(proc.log))
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                if waiting_for == "nodes":
                    nodes = self._api("GET", "/api/v1/nodes")["items"]
                    ready = {n["metadata"]["name"] for n in nodes if _node_ready(n)}
                    if names <= ready:
                        self.durations["nodes"] = time.monotonic() - t0
                        self.say(f"local-cluster: {len(names)} fake nodes Ready in {self.durations['nodes']:.1f} s")
                        waiting_for = "serviceaccount"
                if waiting_for == "serviceaccount":
                    self._api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
                    return
            time.sleep(0.25)
        culprit = "kwok" if waiting_for == "nodes" else "kube-controller-manager"
        raise ComponentError(
            culprit,
            f"cluster not ready within {self.timeout:.0f} s (waiting for {waiting_for})",
            tail(self.processes[culprit].log),
        )

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310 (https to 127.0.0.1)
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, context=self._ssl, timeout=10) as resp:  # noqa: S310 (https to 127.0.0.1)
            result: dict[str, Any] = json.loads(resp.read())
            return result

    # ---------------------------------------------------------------- state

    def _record_state(self) -> None:
        assert self.info is not None
        state = asdict(self.info)
        state["argv"] = {name: p.argv[0] for name, p in self.processes.items()}
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2, default=str))


def _node_ready(node: dict[str, Any]) -> bool:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions", [])
    )
    tainted = any(
        t.get("key", "").startswith("node.kubernetes.io/") for t in node.get("spec", {}).get("taints", []) or []
    )
    return ready and not tainted


def _http_get(url: str, ctx: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:  # noqa: S310 (loopback only)
        return str(resp.read().decode())


def load_state(workdir: Path) -> dict[str, Any] | None:
    path = workdir / STATE_FILE
    if not path.exists():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def running_components(workdir: Path) -> dict[str, int]:
    """The recorded components of a detached cluster that are still running (name -> pid)."""
    state = load_state(workdir)
    if state is None:
        return {}
    argv0: dict[str, str] = state.get("argv", {})
    pids: dict[str, int] = state.get("pids", {})
    return {name: pid for name, pid in pids.items() if _is_ours(pid, argv0.get(name, "")) and _alive(pid)}


def stop_recorded(workdir: Path, grace: float = 10.0) -> list[str]:
    """Stop the processes a detached LocalCluster recorded in `workdir`; returns their names."""
    state = load_state(workdir)
    if state is None:
        return []
    stopped = []
    pids: dict[str, int] = state.get("pids", {})
    argv0: dict[str, str] = state.get("argv", {})
    for name in reversed(list(pids)):
        pid = pids[name]
        if not (_is_ours(pid, argv0.get(name, "")) and _alive(pid)):
            continue
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)
        stopped.append(name)
    (workdir / STATE_FILE).unlink()
    return stopped


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_ours(pid: int, argv0: str) -> bool:
    """Guard against a recycled pid: the process must still run the binary we started."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return bool(argv0) and cmdline == argv0
