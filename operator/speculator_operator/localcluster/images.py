"""The images `hack/build-images` built (podman's store under ~/.cache/speculator-operator), imported into
the real node's containerd: streamed (`podman save` into `ctr images import`, no tar kept), only those
missing or rebuilt since the last import, and images a newer build replaced are removed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from speculator_operator.localcluster import containerd

RUNC = "/usr/sbin/runc"


def built_list(cache: Path) -> dict[str, str]:
    """{reference: podman image id} of the last `hack/build-images` run (empty if it never ran)."""
    path = cache / "images" / "built"
    if not path.exists():
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {ref: image_id for ref, image_id in pairs}


def podman_argv(cache: Path) -> list[str]:
    """podman with this project's store (the same flags as hack/lib/podman.sh)."""
    store = cache / "containers"
    return [
        "podman",
        "--root",
        str(store / "storage"),
        "--runroot",
        str(store / "run"),
        "--runtime",
        RUNC,
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
    ]


def import_built(workdir: Path, cache: Path, say: Callable[[str], None]) -> list[str]:
    """Import what is missing or newer into the node; returns the references imported."""
    built = built_list(cache)
    record = containerd.store(cache) / "imported.json"
    imported: dict[str, str] = json.loads(record.read_text()) if record.exists() else {}
    present = containerd.images(workdir)
    todo = sorted(ref for ref, image_id in built.items() if ref not in present or imported.get(ref) != image_id)
    stale = sorted(ref for ref in imported if ref not in built and ref in present)
    if stale:
        containerd.ctr(workdir, "images", "remove", "--sync", *stale, timeout=300)
        say(f"local-cluster: removed {len(stale)} image(s) a newer build replaced from the node")
    if todo:
        say(f"local-cluster: importing {len(todo)} image(s) into the node: {', '.join(todo)}")
        save = subprocess.Popen(
            [*podman_argv(cache), "save", "--multi-image-archive", "--format", "docker-archive", *todo],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        load = subprocess.run(
            containerd.ctr_argv(workdir, "images", "import", "--snapshotter", "overlayfs", "-"),
            stdin=save.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        assert save.stdout is not None
        save.stdout.close()
        _, err = save.communicate()
        if save.returncode != 0 or load.returncode != 0:
            raise RuntimeError(f"importing {', '.join(todo)} failed: {err.decode()[-2000:]} {load.stderr[-2000:]}")
    record.write_text(json.dumps({ref: built[ref] for ref in built}, indent=2))
    # the CRI plugin also names every image by its id: an id no built reference has any more holds a
    # replaced build's layers; removing it (synchronously: the garbage collection runs) frees them
    ids = {"sha256:" + image_id.removeprefix("sha256:") for image_id in built.values()}
    gone = sorted(r for r in containerd.images(workdir) if r.startswith("sha256:") and r not in ids)
    if gone:
        containerd.ctr(workdir, "images", "remove", "--sync", *gone, timeout=300)
        say(f"local-cluster: removed {len(gone)} replaced image(s) from the node")
    return todo
