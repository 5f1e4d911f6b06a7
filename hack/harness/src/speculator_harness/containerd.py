"""containerd (Debian's) for the real node: its image store under ~/.cache/speculator-operator (images
pulled once stay across clusters), its state, socket and CNI configuration under the cluster's
workdir, runc as the runtime, and the settings this sandbox needs (docs/development/real-node.md §2):
`restrict_oom_score_adj` (no CAP_SYS_RESOURCE), no AppArmor, cgroupfs, streaming on loopback. The hosts
the project's images are named under (registry.hosts) resolve to the harness's registry on loopback, so the
kubelet pulls them as it would from any registry, and a missing tag gets the registry's own answer; every
other registry resolves to a closed port on loopback: its pulls fail at once (ErrImagePull, in the pod's
status) and no pull ever leaves this machine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from speculator_harness.network import cni_config
from speculator_harness.process import Process, Supervisor

CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
RUNC = "/usr/sbin/runc"
CNI_BIN = "/usr/lib/cni"
NAMESPACE = "k8s.io"
PAUSE_IMAGE = "localhost/speculator-pause:3.10"
NO_REGISTRY = "http://127.0.0.1:9"  # the discard port: nothing listens, a pull fails at once


def store(cache: Path) -> Path:
    return cache / "containerd"


def socket_path(workdir: Path) -> Path:
    return workdir / "containerd" / "containerd.sock"


def config(
    workdir: Path, cache: Path, service_cidr: str, registry: str | None = None, hosts: Sequence[str] = ()
) -> Path:
    root = store(cache)
    state = workdir / "containerd" / "state"
    cni = workdir / "cni"
    for folder in (root, state, cni / "net.d", workdir / "cni-ipam"):
        folder.mkdir(parents=True, exist_ok=True)
    (cni / "net.d" / "10-speculator-node.conflist").write_text(
        json.dumps(cni_config(workdir / "cni-ipam", service_cidr), indent=2)
    )
    registries = workdir / "containerd" / "certs.d"
    (registries / "_default").mkdir(parents=True, exist_ok=True)
    (registries / "_default" / "hosts.toml").write_text(f'server = "{NO_REGISTRY}"\n')
    for host in hosts if registry else ():
        # the registry speaks plain HTTP on loopback; it is the only host containerd may ask for these images
        mirror = f"http://{registry}"
        (registries / host).mkdir(parents=True, exist_ok=True)
        (registries / host / "hosts.toml").write_text(
            f'server = "{mirror}"\n\n[host."{mirror}"]\n  capabilities = ["pull", "resolve"]\n'
        )
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    text = f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket_path(workdir)}"
[ttrpc]
  address = "{workdir / "containerd" / "containerd.sock.ttrpc"}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{workdir / "containerd" / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni / "net.d"}"
  [{cri}.registry]
    config_path = "{registries}"
"""
    path = workdir / "containerd" / "config.toml"
    path.write_text(text)
    return path


def ctr_argv(workdir: Path, *args: str) -> list[str]:
    return [CTR, "--address", str(socket_path(workdir)), "--namespace", NAMESPACE, *args]


def ctr(workdir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ctr_argv(workdir, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start(
    sup: Supervisor,
    cache: Path,
    service_cidr: str,
    lock_fd: int,
    registry: str | None = None,
    hosts: Sequence[str] = (),
) -> Process:
    """Start containerd (it holds the node lock: the lock lives exactly as long as the node's runtime), pulling
    the images of `hosts` from `registry`."""
    path = config(sup.workdir, cache, service_cidr, registry, hosts)

    def ready() -> bool:
        return ctr(sup.workdir, "version", timeout=5).returncode == 0

    return sup.launch("containerd", lambda: [CONTAINERD, "--config", str(path)], ready, pass_fds=(lock_fd,))


def images(workdir: Path) -> set[str]:
    out = ctr(workdir, "images", "list", "--quiet")
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def image_digests(workdir: Path) -> dict[str, str]:
    """{reference: the manifest digest it names} of every image the node holds."""
    out = ctr(workdir, "images", "list")
    rows = (line.split() for line in out.stdout.splitlines()[1:] if line.strip())
    return {row[0]: row[2] for row in rows if len(row) >= 3 and row[2].startswith("sha256:")}


def tasks(workdir: Path) -> dict[str, str]:
    """{container id: task status (RUNNING, STOPPED, ...)}."""
    out = ctr(workdir, "tasks", "list")
    rows = (line.split() for line in out.stdout.splitlines()[1:] if line.strip())
    return {row[0]: row[-1] for row in rows if len(row) >= 3}


def running_tasks(workdir: Path) -> list[str]:
    return [task for task, state in tasks(workdir).items() if state != "STOPPED"]


def remove_containers(workdir: Path) -> int:
    """Delete the tasks (their shims exit with them) and the containers and pod sandboxes the kubelet
    left, with their snapshots."""
    for task in tasks(workdir):
        ctr(workdir, "tasks", "delete", "--force", task, timeout=60)
    out = ctr(workdir, "containers", "list", "--quiet")
    ids = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if ids:
        ctr(workdir, "containers", "delete", *ids, timeout=120)
    return len(ids)


def stop_shims(workdir: Path) -> list[int]:
    """The shims of this node that outlived containerd (their tasks are gone by now): stopped."""
    address = str(socket_path(workdir))
    stopped = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address.encode() in argv:
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
                stopped.append(int(proc.name))
    return stopped
