"""The images `hack/build-images` built (podman's store under ~/.cache/speculator-operator): their list, the
podman that reads that store, and the node-side clean-up after a rebuild (the images reach the node by
registry.py's push and the kubelet's pull)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from speculator_harness import containerd

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


# the harness's own name for the build a newer one replaced: it keeps that build's layers in containerd's store
# until the next replacement, so that the kubelet's pull of the new build fetches and unpacks only the layers
# that changed (its lower layers are the same blobs and snapshots); without it, containerd's garbage collector
# dropped every layer with the removed tag and the next pull moved the whole image
PREVIOUS_HOST = "previous.speculator-harness.invalid"


def previous_name(ref: str) -> str:
    """The name a replaced build of `ref` (`host/path:tag` or `host/path@digest`) is kept under on the node: one
    per repository, the last build replaced."""
    path = ref.split("@", 1)[0].split("/", 1)[1]
    return f"{PREVIOUS_HOST}/{path.rsplit(':', 1)[0]}:previous"


def forget_replaced(workdir: Path, cache: Path, pinned: dict[str, str], say: Callable[[str], None]) -> list[str]:
    """Remove from the node what a newer build replaced, so that the kubelet pulls the build the registry now
    holds: a tag that names another manifest than the registry's (`pinned`: reference -> digest), the
    references and image ids of builds no longer built. The replaced build stays under its previous_name
    (a name the kubelet never asks for), so that its layers are still there for the pull of the new one.
    Returns what was removed."""
    built = built_list(cache)
    if not built:
        return []
    present = containerd.image_digests(workdir)
    prefixes = tuple(ref.rsplit(":", 1)[0] for ref in built)
    current = {ref.rsplit(":", 1)[0] + "@" + digest for ref, digest in pinned.items()}
    ids = {"sha256:" + image_id.removeprefix("sha256:") for image_id in built.values()}
    gone, kept = [], {}
    for ref, digest in sorted(present.items()):
        if ref in built:
            if pinned.get(ref) not in (None, digest):
                gone.append(ref)  # the tag of an older build
                kept[previous_name(ref)] = ref
        elif ref.startswith("sha256:"):
            if ref not in ids:
                gone.append(ref)  # the CRI plugin's name for a replaced build's image id
        elif ref.startswith(prefixes) and ref not in current:
            gone.append(ref)  # a replaced build by its digest
            kept.setdefault(previous_name(ref), ref)
    for name, ref in sorted(kept.items()):
        containerd.ctr(workdir, "images", "tag", "--force", ref, name)
    if gone:
        containerd.ctr(workdir, "images", "remove", "--sync", *gone, timeout=300)
        say(
            f"local-cluster: removed {len(gone)} replaced image reference(s) from the node; "
            f"{len(kept)} replaced build(s) kept as {PREVIOUS_HOST}/…:previous for their layers"
        )
    return gone
