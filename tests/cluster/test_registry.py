"""The harness's image registry (the CNCF distribution registry hack/build-kube builds): a push sends what the
registry lacks and nothing else, so a rebuild that changed one layer costs that layer only; the digest the push
returned is the manifest the registry serves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from speculator_harness import images, registry
from speculator_harness.process import Supervisor

from .conftest import missing, node_required

pytestmark = [pytest.mark.cluster, pytest.mark.node]

BIG = 4 * 1024 * 1024  # the layer that must not travel twice
SMALL = 64 * 1024  # the layer a rebuild changes


def _podman(cache: Path, *args: str, cwd: Path | None = None) -> str:
    out = subprocess.run(
        [*images.podman_argv(cache), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, "TMPDIR": str(cache / "tmp")},
        check=False,
    )
    assert out.returncode == 0, f"podman {' '.join(args)}: {out.stderr}"
    return out.stdout.strip()


def _blobs(cache: Path) -> dict[str, int]:
    """{digest: size} of every blob the registry stores (layers, configs and manifests alike)."""
    root = registry.storage(cache) / "docker" / "registry" / "v2" / "blobs" / "sha256"
    return {f"sha256:{p.parent.name}": p.stat().st_size for p in root.glob("*/*/data")}


def _build(cache: Path, context: Path, ref: str, small: bytes) -> str:
    (context / "small.bin").write_bytes(small)
    _podman(cache, "build", "--layers", "-f", "Containerfile", "-t", ref, ".", cwd=context)
    image_id = _podman(cache, "image", "inspect", "--format", "{{.Id}}", ref)
    (cache / "images").mkdir(exist_ok=True)
    (cache / "images" / "built").write_text(f"{ref} {image_id}\n")
    return image_id


def test_a_rebuild_that_changed_one_layer_pushes_that_layer_only(bin_dir: Path, tmp_path: Path) -> None:
    absent = [what for what in ("podman",) if shutil.which(what) is None]
    if not (bin_dir / "registry").exists():
        absent.append(f"{bin_dir}/registry (hack/build-kube)")
    if os.geteuid() != 0:
        absent.append("root (rootful podman)")
    if absent:
        missing(f"missing: {', '.join(absent)}", node_required())
    # a store and a registry of its own, the project's images untouched; short, as podman's runroot must be
    cache = Path(tempfile.mkdtemp(prefix="spec-reg-", dir="/tmp"))
    (cache / "tmp").mkdir(parents=True)
    context = tmp_path / "context"
    context.mkdir()
    # a base from a tarball (no registry is reachable here), then a big layer and a small one
    (context / "root").mkdir()
    (context / "root" / "hello").write_text("hello\n")
    subprocess.run(["tar", "-C", str(context / "root"), "-cf", str(context / "base.tar"), "."], check=True)
    _podman(cache, "import", str(context / "base.tar"), "localhost/registry-test-base:1")
    (context / "big.bin").write_bytes(os.urandom(BIG))  # random: no compression shrinks it
    (context / "Containerfile").write_text(
        "FROM localhost/registry-test-base:1\nCOPY big.bin /big.bin\nCOPY small.bin /small.bin\n"
    )
    ref = "ghcr.io/speculator-operator/registry-test:1"
    sup = Supervisor(tmp_path / "work", bin_dir, timeout=60)
    (sup.workdir / "logs").mkdir(parents=True)
    try:
        address = registry.start(sup, cache)
        said: list[str] = []
        first_id = _build(cache, context, ref, os.urandom(SMALL))
        assert registry.push_built(address, cache, said.append) == [ref]
        first = _blobs(cache)
        assert any(size >= BIG for size in first.values())  # the big layer arrived once
        digest = registry.pinned(cache)[ref]
        _, repo, tag = registry.split_reference(ref)
        assert registry.manifest_digest(address, repo, tag) == digest  # the push's digest is what it serves

        # nothing changed: nothing is pushed at all
        assert registry.push_built(address, cache, said.append) == []
        assert _blobs(cache) == first

        # one layer changed: that layer, the new config and the new manifest arrive, and nothing else
        second_id = _build(cache, context, ref, os.urandom(SMALL))
        assert second_id != first_id
        assert registry.push_built(address, cache, said.append) == [ref]
        new = {d: size for d, size in _blobs(cache).items() if d not in first}
        received = sum(new.values())
        print(f"registry: first push {sum(first.values())} bytes, second push {received} bytes in {len(new)} blobs")
        assert len(new) == 3, new
        assert SMALL <= received < BIG, new
        manifest = json.loads((registry.storage(cache) / "docker" / "registry" / "v2" / "blobs" / "sha256"
                               / registry.pinned(cache)[ref].removeprefix("sha256:")[:2]
                               / registry.pinned(cache)[ref].removeprefix("sha256:") / "data").read_text())  # fmt: skip
        layers = [layer["digest"] for layer in manifest["layers"]]
        assert len(layers) == 3
        assert [d in first for d in layers] == [True, True, False]  # base and big layer reused, small one new
    finally:
        sup.stop_all()
        subprocess.run([*images.podman_argv(cache), "rmi", "--all", "--force"], capture_output=True, check=False)
        shutil.rmtree(cache, ignore_errors=True)
