"""The workloads lane: the real speculators 0.9.0 CLI (and its torch) in their own cached environment."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speculator_harness import LocalCluster, S3Info
from speculator_operator.domain.algorithms import SERVED_AS_DRAFT
from speculator_operator.render.training import WORKSPACE

from ..lanes import REPO, make_tiny_verifier, run_in, workloads_env_path

__all__ = ["REPO", "container_argv", "ensure_bucket", "run_in"]
# every algorithm vLLM loads as a draft (the algorithm table): each one a `train --dry-run` from the tiny verifier
ALGORITHMS = tuple(SERVED_AS_DRAFT)
# the vLLM processes started here run as the server image's cpu variant runs them: the model in the engine's
# own process, no worker process beside it (docs/performance/vllm-cpu-startup.md)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def workloads_env() -> Path:
    return workloads_env_path()


@pytest.fixture(scope="session")
def vllm_env() -> Path:
    env = os.environ.get("SPECULATOR_VLLM_ENV")
    if not env:
        out = subprocess.run([str(REPO / "hack" / "workloads-env"), "vllm"], check=True, capture_output=True,
                             text=True)  # fmt: skip
        env = out.stdout.strip().splitlines()[-1]
    return Path(env)


@pytest.fixture(scope="session")
def dry_run_checkpoints(workloads_env: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints written by the real `speculators train --dry-run` from a tiny local verifier."""
    root = tmp_path_factory.mktemp("speculators")
    verifier = root / "verifier"
    make_tiny_verifier(workloads_env, verifier)
    (root / "data").mkdir()
    out = {"verifier": verifier}
    common = [
        "--verifier-name-or-path",
        str(verifier),
        "--data-path",
        str(root / "data"),
        "--log-dir",
        str(root / "logs"),
    ]
    for algo in ALGORITHMS:
        run_in(workloads_env, "speculators", "train", "--dry-run", "--speculator-type", algo,
               "--save-path", str(root / algo), *common)  # fmt: skip
        out[algo] = root / algo
    # a pruned draft vocabulary (t2d/d2t) from vocab maps made here
    run_in(workloads_env, "python", "-c", (
        "import numpy as np; V, Vd = 512, 256; rng = np.random.default_rng(0); "
        "ids = np.sort(rng.choice(V, Vd, replace=False)); t2d = np.zeros(V, bool); t2d[ids] = True; "
        f"np.save('{root}/t2d.npy', t2d); np.save('{root}/d2t.npy', (ids - np.arange(Vd)).astype(np.int64))"
    ))  # fmt: skip
    run_in(workloads_env, "speculators", "train", "--dry-run", "--speculator-type", "eagle3",
           "--save-path", str(root / "eagle3-pruned"), "--draft-vocab-size", "256",
           "--d2t-path", str(root / "d2t.npy"), "--t2d-path", str(root / "t2d.npy"), *common)  # fmt: skip
    out["eagle3-pruned"] = root / "eagle3-pruned"
    return out


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Info]:
    """A real S3 protocol server (the local cluster's, alone)."""
    bins = (
        os.environ.get("SPECULATOR_BIN_DIR")
        or subprocess.run(
            [str(REPO / "hack" / "build-kube"), "--print-bin-dir"], check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    local = LocalCluster(tmp_path_factory.mktemp("s3"), Path(bins))
    info = local.start_s3_only()
    try:
        yield info
    finally:
        local.stop()


def container_argv(child: dict[str, Any], workspace: Path) -> list[str]:
    """A stage Job's container command, with the workspace mount made a local folder."""
    (c,) = child["spec"]["template"]["spec"]["containers"]
    return [a.replace(WORKSPACE, str(workspace)) for a in [*c["command"], *c["args"]]]


def ensure_bucket(s3: S3Info, bucket: str) -> Any:
    """An S3 client, with `bucket` made if it is not there yet (the S3 server is the session's)."""
    s3c = s3.client()
    if bucket not in {b["Name"] for b in s3c.list_buckets().get("Buckets", [])}:
        s3c.create_bucket(Bucket=bucket)
    return s3c
