"""One real node beside kwok's fakes: containerd, the kubelet, kube-proxy and the cluster DNS on a bridge
network this host owns, running the images `hack/build-images` built. Only one fits on a machine (fixed
ports, kube-proxy's tables, the bridge): a lock, held by the node's containerd, keeps a second one out.

`unavailable()` says why a node cannot run here (then the cluster starts without it); `prepare()` takes
the lock and makes the network before the API server starts on the gateway address; `start()` starts the
components; `teardown()` lets the kubelet remove the pods, stops the components and undoes every trace
(traces.py), from this process or from the state another process recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speculator_harness import containerd, coredns, images, kubelet, kubeproxy, network, registry, traces
from speculator_harness.apiserver import Api, write_kubeconfig
from speculator_harness.process import ComponentError, Supervisor, tail

LOCK = Path("/run/speculator-operator/node.lock")
BINARIES = ("kubelet", "kube-proxy", "coredns", "registry")
HOST_TOOLS = {
    "containerd": containerd.CONTAINERD,
    "runc": containerd.RUNC,
    "ctr": containerd.CTR,
    "CNI bridge plugin": f"{containerd.CNI_BIN}/bridge",
    "nft": "/usr/sbin/nft",
    "ip": "/usr/sbin/ip",
}
COMPONENTS = ("registry", "containerd", "kubelet", "coredns", "kube-proxy")


class NodeUnavailable(Exception):
    """Why the real node cannot run here."""


def unavailable(bin_dir: Path, cache: Path) -> str | None:
    """Why a real node cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "not root (the kubelet, containerd and the bridge network need root)"
    missing = [what for what, path in HOST_TOOLS.items() if not os.access(path, os.X_OK)]
    if missing:
        return f"missing on this host: {', '.join(missing)} (hack/test installs them with apt-get)"
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        return f"binaries not built: {', '.join(missing)} (run hack/build-kube)"
    if containerd.PAUSE_IMAGE not in images.built_list(cache):
        return "no images built (run hack/build-images)"
    return None


def lock_holder() -> str:
    """The folder of the cluster whose real node runs now, or "" (also when the lock file names a node that
    was killed without its teardown: nobody holds its lock)."""
    try:
        fd = os.open(LOCK, os.O_RDONLY)
    except OSError:
        return ""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return LOCK.read_text().strip()
        return ""
    finally:
        os.close(fd)  # a shared lock taken here goes with the fd


@contextlib.contextmanager
def stale_lock() -> Iterator[str]:
    """The folder a node lock names while nobody holds it (a node killed without its teardown: a killed
    test run, a restarted machine), with the lock held until the caller has undone that node; "" when
    there is no such node."""
    try:
        fd = os.open(LOCK, os.O_RDWR)
    except OSError:
        yield ""
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield ""  # a node runs: not stale
            return
        folder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        yield folder
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def acquire_lock(workdir: Path) -> int:
    """The machine's one real node is ours until the returned fd (and every process given it) closes."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise NodeUnavailable(
            f"a real node already runs on this machine (cluster in {lock_holder() or 'an unknown folder'}); "
            "stop it first (hack/dev-cluster down --dir THAT_FOLDER)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(workdir).encode())
    return fd


@dataclass
class Prepared:
    lock_fd: int
    undo: dict[str, Any]  # network.up's record
    dirs_before: list[str]
    registry: str | None = None  # host:port of the image registry
    pushed: list[str] = field(default_factory=list)  # the references this start pushed to it
    digests: dict[str, str] = field(default_factory=dict)  # reference -> manifest digest, of every built image


def prepare(workdir: Path, service_cidr: str) -> Prepared:
    """Take the machine's node lock and make the bridge network (before the API server binds its gateway)."""
    before = traces.snapshot()["dirs"]
    fd = acquire_lock(workdir)
    try:
        undo = network.up(service_cidr)
    except BaseException:
        os.close(fd)
        raise
    return Prepared(fd, undo, before)


def start(
    sup: Supervisor,
    prepared: Prepared,
    pki: dict[str, Path],
    api: Api,
    cache: Path,
    service_cidr: str,
    started: Callable[[], None] = lambda: None,
) -> None:
    """The registry (what it lacks pushed), containerd (pulling the built images' hosts from it), the kubelet
    (until the node is Ready), the DNS, kube-proxy."""
    t0 = time.monotonic()
    address = prepared.registry = registry.start(sup, cache)
    started()  # recorded before the push, which may take minutes: a start killed during it leaves no registry
    t1 = time.monotonic()
    try:
        prepared.pushed = registry.push_built(address, cache, sup.say)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        raise ComponentError("registry", f"pushing the built images: {exc}", tail(sup.log_path("registry"))) from None
    prepared.digests = registry.pinned(cache)
    sup.durations["node-images-push"] = time.monotonic() - t1
    took = sup.durations["node-images-push"]
    sup.say(f"local-cluster: {len(prepared.pushed)} image(s) pushed to the registry in {took:.1f} s")
    # and the registry under its own address: what `hack/release 127.0.0.1:PORT/...` pushed and a chart names
    hosts = [*registry.hosts(sorted(images.built_list(cache))), address]
    containerd.start(sup, cache, service_cidr, prepared.lock_fd, address, hosts)
    images.forget_replaced(sup.workdir, cache, prepared.digests, sup.say)
    server = api.server
    node_kc = write_kubeconfig(sup.workdir / "node.kubeconfig", server, pki, "node")
    proxy_kc = write_kubeconfig(sup.workdir / "kube-proxy.kubeconfig", server, pki, "kube-proxy")
    admin_kc = sup.workdir / "kubeconfig"
    kubelet.start(sup, node_kc, pki["ca.crt"], network.GATEWAY, containerd.socket_path(sup.workdir))
    wait_ready(sup, api)
    coredns.start(sup, admin_kc)
    kubeproxy.start(sup, proxy_kc)
    sup.durations["node"] = time.monotonic() - t0


def wait_ready(sup: Supervisor, api: Api) -> None:
    t0 = time.monotonic()
    deadline = t0 + sup.timeout
    while time.monotonic() < deadline:
        sup.check_running()
        with contextlib.suppress(OSError, ValueError):
            node = api.call("GET", f"/api/v1/nodes/{kubelet.NODE_NAME}")
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                sup.durations["node-ready"] = time.monotonic() - t0
                took = sup.durations["node-ready"]
                sup.say(f"local-cluster: real node {kubelet.NODE_NAME} Ready {took:.1f} s after the kubelet started")
                return
        time.sleep(0.2)
    problem = f"node {kubelet.NODE_NAME} not Ready within {sup.timeout:.0f} s"
    raise ComponentError("kubelet", problem, tail(sup.log_path("kubelet")))


def record(prepared: Prepared) -> dict[str, Any]:
    """What another process needs to take the node down (the state file's `node_record`)."""
    return {
        "name": kubelet.NODE_NAME,
        "undo": prepared.undo,
        "dirs_before": prepared.dirs_before,
        "registry": prepared.registry,
    }


def _delete_pods(api: Api | None, workdir: Path, timeout: float = 90) -> None:
    """Drain the node: cordon it, so that a controller's replacement for a deleted pod is not bound to it
    again (the controller manager still runs), delete its pods, and wait until the kubelet has stopped
    them (CNI teardown, unmounts), deleting any pod bound before the cordon took. Without an API server (a
    node killed without its teardown) nobody is asked and nothing is awaited: the caller kills what is
    left."""
    if api is None:
        return
    with contextlib.suppress(OSError, ValueError):
        api.call("PATCH", f"/api/v1/nodes/{kubelet.NODE_NAME}", {"spec": {"unschedulable": True}})
    pods_dir = kubelet.root_dir(workdir) / "pods"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            pods = api.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={kubelet.NODE_NAME}")["items"]
            for pod in pods:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                    api.call("DELETE", path, {"gracePeriodSeconds": 0})
        busy = containerd.running_tasks(workdir) if containerd.socket_path(workdir).exists() else []
        mounted = [m for m in traces.mounts() if m.startswith(str(pods_dir) + "/")]
        if not busy and not mounted:
            return
        time.sleep(0.5)


def teardown(workdir: Path, rec: dict[str, Any], api: Api | None, stop: Callable[[str], None]) -> list[str]:
    """Take the node down and undo its traces; `stop(name)` stops one of its components. Returns what
    was undone (for the log)."""
    done: list[str] = []
    _delete_pods(api, workdir)
    for name in ("kube-proxy", "coredns", "kubelet"):
        stop(name)
    done += kubeproxy.remove_tables()
    if containerd.socket_path(workdir).exists():
        with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
            for task in containerd.running_tasks(workdir):
                containerd.ctr(workdir, "tasks", "kill", "--signal", "SIGKILL", task)
            containerd.remove_containers(workdir)
    stop("containerd")  # the node lock goes with it
    stop("registry")
    done += [f"shim {pid}" for pid in containerd.stop_shims(workdir)]
    done += [f"container process {pid}" for pid in traces.kill_cgroup_processes()]
    done += traces.unmount_under(
        kubelet.root_dir(workdir), workdir / "containerd", Path("/run/containerd"), Path("/run/netns")
    )
    done += traces.remove_cgroups()
    done += network.down(rec.get("undo") or {})
    done += traces.remove_new_dirs(list(rec.get("dirs_before") or []))  # the lock's folder among them
    shutil.rmtree(kubelet.root_dir(workdir), ignore_errors=True)
    return done
