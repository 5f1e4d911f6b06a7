"""The images tier's shared parts: the release under check, podman on hack/build-images' store, running an image
without a network, and the evidence `hack/qualify-release` records (domain/qualification.py).

The release under check is $SPECULATOR_QUALIFY_RELEASE (hack/qualify-release sets it), else the default one. With
$SPECULATOR_EVIDENCE_OUT set, every test of the session is one check of the evidence written there at its end,
and the images the checks ran in are named by digest and stack (tests/workloads/conftest.py writes it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.domain.qualification import ImageEvidence, installed_versions, stack_digest
from speculator_operator.domain.releases import DEFAULT_RELEASE, Release, release_row

from ..lanes import REPO

QUALIFY_ENV = "SPECULATOR_QUALIFY_RELEASE"
EVIDENCE_ENV = "SPECULATOR_EVIDENCE_OUT"
UNBUILT_ENV = "SPECULATOR_UNBUILT"  # {role: why} for images hack/qualify-release could not build
# the images the session's checks ran in, by role (written into the evidence at the session's end)
IMAGES: dict[str, ImageEvidence] = {}


def qualifying() -> Release:
    """The release this session checks: any row of the table (an Unqualified one is what qualification is for)."""
    return release_row(os.environ.get(QUALIFY_ENV) or DEFAULT_RELEASE)


def podman() -> list[str]:
    """podman on the image store hack/build-images builds into: hack/lib/podman.sh's `pod`, the one definition."""
    return ["bash", "-c", f'source "{REPO}/hack/lib/podman.sh" && pod "$@"', "pod"]


def built_image(ref: str, how: str) -> str:
    """`ref` where it is built here, else a skip saying how to build it (a recorded skip fails a qualification)."""
    if shutil.which("podman") is None:
        pytest.skip("no podman here (the images tier needs root and hack/build-images)")
    found = subprocess.run([*podman(), "image", "exists", ref], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"{ref} is not built here: {how}")
    return ref


def run_image(
    image: str,
    *args: str,
    mounts: dict[Path, str] | None = None,
    env: dict[str, str] | None = None,
    entrypoint: str | None = None,
    stdin: str | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`podman run` of the image, the network off; a mount's target "rw:/path" is writable, any other read-only."""
    # the machine's hard limits on open files and processes are below podman's defaults (docs/development/real-node.md)
    cmd = [*podman(), "run", "--rm", "-i", "--network", "none", "--ulimit", "nofile=20000:20000",
           "--ulimit", "nproc=1024:1024"]  # fmt: skip
    for host, where in (mounts or {}).items():
        cmd += ["-v", f"{host}:{where}:ro,z" if not where.startswith("rw:") else f"{host}:{where[3:]}:z"]
    for name, value in (env or {}).items():
        cmd += ["-e", f"{name}={value}"]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, image, *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def record_image(role: str, image: str) -> dict[str, str]:
    """What is installed in `image` ({distribution: version}, this package left out), noted for the evidence."""
    out = run_image(image, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check",
                    entrypoint="python")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    installed = installed_versions(out.stdout)
    digest = subprocess.run([*podman(), "image", "inspect", "--format", "{{.Digest}}", image], capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    IMAGES[role] = ImageEvidence(reference=image, digest=digest, stack=stack_digest(installed), installed=installed)
    return installed


def readable_copy(source: Path, target: Path, overrides: dict[str, Any] | None = None) -> Path:
    """A copy the image's non-root user can read (the dry-run writes its files for its owner only). `overrides` set
    config keys wherever they appear: the rendered GPU examples ask for long contexts and 8-way tensor parallelism,
    which the tiny models' configs refuse (512 positions, 2 attention heads); nothing here loads the weights, so
    only the configs must agree with the arguments, as a real 8B or 405B model's do."""
    shutil.copytree(source, target)
    if overrides:
        config = json.loads((target / "config.json").read_text())
        _override(config, overrides)
        (target / "config.json").write_text(json.dumps(config))
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def _override(config: Any, overrides: dict[str, Any]) -> None:
    """Set each override wherever the config (or a config nested in it) has that key."""
    if isinstance(config, dict):
        for key, value in overrides.items():
            if key in config:
                config[key] = value
        for nested in config.values():
            _override(nested, overrides)
