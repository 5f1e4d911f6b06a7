"""What a real node leaves on the host (docs/development/real-node.md §3), seen and undone: sysctls, nft
tables, mounts, network links and namespaces, cgroups, and the folders the kubelet, containerd and CNI
create at fixed paths. `snapshot()` is what a test compares before `up` and after `down`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from speculator_harness.network import read_sysctls

# folders the node's components create at fixed paths whatever they are told
FIXED_DIRS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/run/speculator-operator",  # the node lock's folder
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAMES = ("kubepods", "kubepods.slice", "k8s.io")


def mounts() -> list[str]:
    """Mount points, as /proc/self/mountinfo lists them."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4:
            out.append(fields[4].encode().decode("unicode_escape"))
    return out


def cgroups() -> list[str]:
    """Our cgroups under each hierarchy (kubepods, containerd's k8s.io)."""
    found = []
    if CGROUP_ROOT.is_dir():
        for hierarchy in CGROUP_ROOT.iterdir():
            for name in CGROUP_NAMES:
                if (hierarchy / name).is_dir():
                    found.append(str(hierarchy / name))
    return sorted(found)


def shims() -> list[str]:
    """containerd shims (the processes that keep containers' tasks), by the containerd they belong to."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
            if argv and argv[0].endswith(b"containerd-shim-runc-v2"):
                found.append(b" ".join(argv[1:]).decode(errors="replace"))
    return sorted(found)


def snapshot() -> dict[str, Any]:
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    return {
        "sysctls": read_sysctls(),
        "nft_tables": sorted(line.strip() for line in tables.splitlines() if line.strip()),
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line),
        "mounts": sorted(mounts()),
        "cgroups": cgroups(),
        "dirs": sorted(d for d in FIXED_DIRS if os.path.lexists(d)),
        "shims": shims(),
    }


def unmount_under(*roots: Path) -> list[str]:
    """Unmount everything mounted on or below these folders (the kubelet makes its root folder a mount
    of its own), deepest first; lazily as a last resort."""
    bases = [str(r.resolve()).rstrip("/") for r in roots]
    targets = sorted(
        (m for m in mounts() if any(m == b or m.startswith(b + "/") for b in bases)), key=len, reverse=True
    )
    for target in targets:
        done = subprocess.run(["umount", target], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    return targets


def cgroup_processes() -> set[int]:
    """The processes in our cgroups: the containers' (and sandboxes') processes."""
    pids: set[int] = set()
    for top in cgroups():
        for folder, _, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids |= {int(line) for line in Path(folder, "cgroup.procs").read_text().split()}
    return pids


def kill_cgroup_processes(timeout: float = 10.0) -> list[int]:
    """Kill the containers' processes that outlived their shims (a node killed without its teardown);
    returns their pids. Their network namespaces go with the last of them."""
    killed = sorted(cgroup_processes())
    for pid in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while cgroup_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed


def remove_cgroups() -> list[str]:
    """Remove our (empty by now) cgroup trees, leaves first."""
    removed = []
    for top in cgroups():
        for path in sorted((p for p, _, _ in os.walk(top)), key=len, reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(path)
                removed.append(path)
    return removed


def remove_new_dirs(existed_before: list[str]) -> list[str]:
    """Remove the fixed-path folders that did not exist before the node started (and what is in them:
    only the node's components write there)."""
    removed = []
    for path in FIXED_DIRS:
        if path in existed_before or not os.path.lexists(path):
            continue
        unmount_under(Path(path))
        subprocess.run(["rm", "-rf", "--one-file-system", path], capture_output=True, check=False)
        removed.append(path)
    return removed
