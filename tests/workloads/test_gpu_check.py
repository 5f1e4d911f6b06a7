"""hack/gpu-check, the check for the day a GPU machine is at hand (docs/development/gpu-check.md), on its CPU path:
the TrainJob's rendered prepare, train and audit commands run through the trainer entry with the real speculators
0.9.0, on a tiny random verifier and hidden states made without vLLM in the layout the extraction server writes;
a few EAGLE-3 steps and a falling loss. `--device cuda` on a machine without CUDA exits with its own code, and the
verdict on the loss is the one the exit code 7 rests on."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import REPO

pytestmark = pytest.mark.workloads
GPU_CHECK = REPO / "hack" / "gpu-check"


def run_check(workloads_env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_CHECK_PYTHON": str(workloads_env / "bin" / "python")}
    return subprocess.run([str(GPU_CHECK), *args], capture_output=True, text=True, timeout=900, env=env)


def gpu_check_module() -> ModuleType:
    if "gpu_check" in sys.modules:
        return sys.modules["gpu_check"]
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "hack" / "lib" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_cpu_path_trains_eagle3_through_the_trainer_stage(workloads_env: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    ran = run_check(workloads_env, "--device", "cpu", "--work", str(work), "--out", str(out), "--keep")
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["ok"] is True
    assert result["device"] == "cpu"

    # one file per prepared row, with the layers the rendered extraction server is asked for (the trainer's
    # target layers and the last one), checked against a plain forward of the verifier
    hs = result["hidden_states"]
    assert hs["files"] == hs["rows"] == result["size"]["rows"]
    assert hs["layers"] == [2, 4, 5, 8]
    assert hs["self_check"]["ok"] is True
    assert sorted(p.name for p in (work / "workspace" / "hidden_states").iterdir())[:2] == [
        "hs_0.safetensors",
        "hs_1.safetensors",
    ]

    # trained by the trainer entry: its stage report, every step logged, the loss falling
    train = result["train"]
    assert train["exit"] == 0
    assert train["stage_report"]["stage"] == "train"
    assert train["stage_report"]["epoch"] == result["size"]["epochs"]
    assert train["steps"] >= result["size"]["steps"]
    assert result["loss"]["ok"] is True
    assert result["loss"]["end"] < result["loss"]["start"]
    assert train["steps_per_s_wall"] > 0
    assert train["peak_memory_mib"]["max_rss_mib"] > 0
    log = (out / "train.log").read_text()
    assert "--on-missing raise" in log  # offline: a missing or unreadable hidden-state file would have failed it
    assert "match input ids" not in log  # speculators' warning for a file whose token ids are not the row's

    # the trainer's own checkpoint, passed by the rendered audit stage
    config = json.loads((work / "workspace" / "checkpoints" / "0" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == result["size"]["draft_vocab"]
    assert result["audit"]["report"]["audit"]["ok"] is True
    assert {"result.json", "prepare.log", "train.log", "audit.log", "torch-helper.log"} <= {
        p.name for p in out.iterdir()
    }


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU: the check would run on it")
def test_cuda_asked_for_without_cuda_exits_3(workloads_env: Path, tmp_path: Path) -> None:
    ran = run_check(workloads_env, "--device", "cuda", "--work", str(tmp_path), "--out", str(tmp_path / "out"))
    assert ran.returncode == 3, ran.stdout[-3000:] + ran.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["ok"] is False
    assert result["exit"] == 3
    assert not (tmp_path / "workspace" / "verifier").exists()  # stopped before making anything


def test_the_loss_verdict() -> None:
    verdict = gpu_check_module().loss_verdict

    def points(losses: list[float]) -> list[tuple[int, float, float]]:
        return [(i, loss, float(i)) for i, loss in enumerate(losses)]

    falling = verdict(points([1.0, 0.9, 0.95, 0.8, 0.7, 0.72, 0.6, 0.5, 0.55]), 0.1)
    assert falling["ok"] is True
    assert falling["start"] == pytest.approx(0.95)
    assert falling["end"] == pytest.approx(0.55)
    flat = verdict(points([1.0, 0.9, 1.1, 1.0, 0.95, 1.05, 1.0, 0.98, 1.02]), 0.1)
    assert flat["ok"] is False
    rising = verdict(points([0.5, 0.6, 0.7, 0.8, 0.9, 1.0]), 0.1)
    assert rising["ok"] is False
    assert rising["drop"] < 0
    too_few = verdict(points([1.0, 0.5, 0.2]), 0.1)
    assert too_few["ok"] is False
    assert "start" not in too_few  # the run exits 6 (no usable loss), not 7
    assert verdict(points([1.0, float("nan"), 0.9, 0.8, 0.3, 0.2, 0.1]), 0.1)["ok"] is True
