"""The heavy lanes' environments, shared by the workloads and the node tests: the real speculators CLI (and
its torch) in a cached virtual environment, and the tiny verifier made with it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
