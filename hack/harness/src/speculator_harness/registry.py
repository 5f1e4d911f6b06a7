"""The image registry of the real node: the CNCF distribution registry (hack/build-kube builds it with its
filesystem driver only), on loopback, its storage under ~/.cache/speculator-operator/registry so that what
was pushed once stays across clusters. The node's containerd pulls the project's images from it (containerd.py
points the images' registry hosts at it); every other registry stays a closed port.

Pushing (`push_built`): every image `hack/build-images` built whose manifest the registry lacks, or holds for
another build, is pushed with `podman push --digestfile`; layers the registry already has are not sent again.
The manifest digests the pushes returned are recorded beside the build list (`digests`), and that record is
what the harness hands to the operator and the chart (`SPECULATOR_IMAGE_DIGESTS`, the chart's values).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from speculator_harness import images
from speculator_harness.process import LOOPBACK, Supervisor

NAME = "registry"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


def storage(cache: Path) -> Path:
    return cache / "registry"


def digests_path(cache: Path) -> Path:
    return cache / "images" / "digests.json"


def config(workdir: Path, cache: Path, port: int) -> Path:
    """The registry's configuration: loopback only, the filesystem driver under the cache, no auth (nothing
    but this machine can dial it), deletes allowed (a replaced build's manifest can be removed)."""
    root = storage(cache)
    root.mkdir(parents=True, exist_ok=True)
    text = f"""version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {LOOPBACK}:{port}
  draintimeout: 2s
health:
  storagedriver:
    enabled: false
"""
    path = workdir / "registry" / "config.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def port_path(cache: Path) -> Path:
    return cache / "images" / "registry-port"


def stable_port(sup: Supervisor, cache: Path) -> int:
    """The port the registry listened on last time, when it is free; else a free one, remembered for the next
    start. podman's blob-info cache knows which layers a registry holds by its host:port: against the same
    storage on a new port, a push compresses every layer again to learn its digest (the trainer image: 97 s
    on a new port, 0 s on the same one; docs/performance/test-time.md)."""
    path = port_path(cache)
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        port = 0
    if NAME not in sup.ports and 0 < port < 65536 and port_free(port):
        sup.ports[NAME] = port
    else:  # none remembered, taken, or this is a retry after the port was lost
        port = sup.port(NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{port}\n")
    return port


def port_free(port: int) -> bool:
    """Whether the registry could listen on `port`: SO_REUSEADDR as Go's listeners set it, so that the last
    registry's connections in TIME_WAIT do not count as taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def start(sup: Supervisor, cache: Path) -> str:
    """Start the registry on its remembered port (stable_port); returns its host:port (on loopback)."""

    def argv() -> list[str]:
        return [sup.bin(NAME), "serve", str(config(sup.workdir, cache, stable_port(sup, cache)))]

    def ready() -> bool:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{sup.ports[NAME]}/v2/", timeout=2) as resp:
            return bool(resp.status == 200)

    sup.launch(NAME, argv, ready)
    return f"{LOOPBACK}:{sup.ports[NAME]}"


def split_reference(ref: str) -> tuple[str, str, str]:
    """`host/path/name:tag` -> (host, repository path, tag). The registry holds every host's images by their
    path alone (containerd asks it for the path under whichever host it mirrors)."""
    host, rest = ref.split("/", 1)
    repo, tag = rest.rsplit(":", 1)
    return host, repo, tag


def hosts(refs: list[str]) -> list[str]:
    """The registry hosts the built images are named under (ghcr.io for the project's images, localhost for
    the pause image): containerd mirrors each of them, and only them, to this registry."""
    return sorted({split_reference(ref)[0] for ref in refs})


def manifest_digest(address: str, repo: str, reference: str) -> str | None:
    """The digest the registry holds for `repo:reference` (a tag or a digest), or None when it has none."""
    request = urllib.request.Request(
        f"http://{address}/v2/{repo}/manifests/{reference}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            return str(resp.headers.get("Docker-Content-Digest") or "") or None
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def load_digests(cache: Path) -> dict[str, dict[str, str]]:
    """{reference: {"id": podman image id, "digest": manifest digest}} of the last pushes."""
    path = digests_path(cache)
    return json.loads(path.read_text()) if path.exists() else {}


def pinned(cache: Path) -> dict[str, str]:
    """{reference: manifest digest} of every built image the registry holds: SPECULATOR_IMAGE_DIGESTS."""
    built = images.built_list(cache)
    return {ref: rec["digest"] for ref, rec in load_digests(cache).items() if built.get(ref) == rec.get("id")}


def push_image(cache: Path, ref: str, destination: str, tls_verify: bool = False) -> str:
    """`podman push --digestfile` of the built image `ref` to `destination` (host[:port]/path:tag); returns the
    manifest digest the registry stored. hack/release pushes the same way to a registry of one's own."""
    with tempfile.TemporaryDirectory() as tmp:
        digestfile = Path(tmp) / "digest"
        # zstd: a registry takes only compressed layers from podman, and zstd compresses the ~13 GB of
        # layers in a fraction of gzip's CPU time; containerd (1.5 and later) unpacks zstd layers. A
        # layer pushed before is not compressed again: podman's blob-info cache knows its digest there
        argv = [
            *images.podman_argv(cache),
            "push",
            f"--tls-verify={'true' if tls_verify else 'false'}",
            "--quiet",
            "--compression-format",
            "zstd",
            "--digestfile",
            str(digestfile),
            ref,
            f"docker://{destination}",
        ]
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, env={**os.environ, "TMPDIR": tmp}, timeout=3600
        )
        if done.returncode != 0:
            raise RuntimeError(f"podman push {ref} failed ({done.returncode}): {done.stderr[-2000:]}")
        return digestfile.read_text().strip()


def push_built(address: str, cache: Path, say: Callable[[str], None]) -> list[str]:
    """Push what the registry lacks (or holds for an older build); returns the references pushed."""
    built = images.built_list(cache)
    record = load_digests(cache)
    todo = []
    for ref, image_id in sorted(built.items()):
        _, repo, tag = split_reference(ref)
        have = manifest_digest(address, repo, tag)
        known = record.get(ref) or {}
        if have is None or known.get("id") != image_id or known.get("digest") != have:
            todo.append(ref)
    for ref in todo:
        _, repo, tag = split_reference(ref)
        say(f"local-cluster: pushing {ref} to the registry")
        digest = push_image(cache, ref, f"{address}/{repo}:{tag}")
        record[ref] = {"id": built[ref], "digest": digest}
        digests_path(cache).parent.mkdir(parents=True, exist_ok=True)
        digests_path(cache).write_text(json.dumps(record, indent=2, sort_keys=True))
    # forget what no build names any more (the registry keeps its blobs; the next push reuses shared ones)
    record = {ref: rec for ref, rec in record.items() if ref in built}
    digests_path(cache).parent.mkdir(parents=True, exist_ok=True)
    digests_path(cache).write_text(json.dumps(record, indent=2, sort_keys=True))
    return todo
