"""The pytest lanes hack/test runs side by side, and the heavy lanes' environments, shared by the workloads and the
node tests: the real speculators CLI (and its torch) in a cached virtual environment, and the tiny verifier made
with it.

The lanes (hack/test, without arguments): tests/cluster is split in two, each lane with a session cluster of its
own. The real node's lane has the machine's one real node: the tests marked `node` or `before_cluster` (they
start one themselves), and those marked `node_lane` (they assert about the real node where one runs). The
control plane's lane is the rest of tests/cluster, on a cluster that never starts a real node. tests/unit and
tests/workloads are the third lane. Tiers are what the per-tier sums count (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# which part of tests/cluster this pytest process runs (hack/test sets it per lane); unset: all of it
LANE_ENV = "SPECULATOR_TEST_LANE"
NODE_LANE = "node"
CONTROL_PLANE_LANE = "control-plane"
LANES = (NODE_LANE, CONTROL_PLANE_LANE)


def lane() -> str | None:
    """The lane this process runs (SPECULATOR_TEST_LANE), or None for the whole of tests/cluster."""
    name = os.environ.get(LANE_ENV) or None
    if name is not None and name not in LANES:
        raise pytest.UsageError(f"{LANE_ENV}={name}: expected one of {', '.join(LANES)}")
    return name


def in_node_lane(item: pytest.Item) -> bool:
    """A cluster test that needs the machine's one real node, or checks it where one runs."""
    return any(item.get_closest_marker(m) is not None for m in ("node", "before_cluster", "node_lane"))


def tier(item: pytest.Item) -> str:
    """The tier a test counts to in the per-tier sums: its folder under tests/, the cluster tier split by lane."""
    path = Path(str(item.path)).resolve()
    parts = path.relative_to(REPO / "tests").parts if path.is_relative_to(REPO / "tests") else ()
    top = parts[0] if len(parts) > 1 else "other"
    if top == "cluster":
        return "cluster (real node)" if in_node_lane(item) else "cluster (control plane)"
    return top


def workloads_env_path() -> Path:
    env = os.environ.get("SPECULATOR_WORKLOADS_ENV")
    if not env:
        out = subprocess.run([str(REPO / "hack" / "workloads-env")], check=True, capture_output=True, text=True)
        env = out.stdout.strip().splitlines()[-1]
    return Path(env)


def run_in(env: Path, *args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(env / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def make_tiny_verifier(env: Path, out: Path) -> Path:
    """A tiny random Qwen3 verifier with a real tokenizer (hack/lib/tiny_verifier.py)."""
    run_in(env, "python", str(REPO / "hack" / "lib" / "tiny_verifier.py"), str(out))
    return out
