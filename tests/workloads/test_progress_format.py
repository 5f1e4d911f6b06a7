"""The train-step progress parser on speculators 0.9.0's own log output: its logging set-up
(train/logger.py setup_root_logger and setup_metric_logger, as train/cli.py calls them) prints the mappings
the trainer logs (train/trainer.py: each logged step's metrics, epoch, lr and global_step; each epoch's
validation) and the epoch lines, here in a subprocess as in a pod (no terminal, COLUMNS set by the trainer
entrypoint). A real training step needs an accelerator: the same parser is to be confirmed on a GPU's log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from speculator_operator.pods import progress

pytestmark = pytest.mark.workloads

SCRIPT = """
import logging
from speculators.train.logger import setup_metric_logger, setup_root_logger
setup_root_logger()
setup_metric_logger("", "run", "logs")
root, metrics = logging.getLogger(), logging.getLogger("speculators.metrics")
root.info("Training epoch 1/2 started")
for step in range(3):
    metrics.info({"train": {"loss": 2.5 - step * 0.25, "full_acc_0": 0.1 * step, "full_acc_1": 0.0004},
                  "profile": {"tokens_per_s": 12000.0}, "epoch": 0, "lr": 0.0003, "global_step": step},
                 extra={"step": step})
root.info("Training epoch 1/2 completed")
metrics.info({"val": {"loss_epoch": 2.125, "full_acc_0_epoch": 0.21}, "epoch": 0}, extra={"step": 3})
root.info("Training epoch 2/2 started")
"""


def test_the_parser_reads_speculators_own_log_lines(workloads_env: Path, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "1000", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([str(workloads_env / "bin" / "python"), "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    tracker = progress.Tracker("train")
    for line in (out.stdout + out.stderr).splitlines():
        tracker.line(line)
    snap = tracker.snapshot()
    assert snap["step"] == 2
    assert (snap["epoch"], snap["epochs"], snap["epochsCompleted"]) == (2, 2, 1)
    assert snap["loss"] == 2.0
    assert snap["metrics"]["train/full_acc_0"] == 0.2
    assert snap["metrics"]["train/full_acc_1"] == 4e-4  # printed as 4.00e-04
    assert snap["metrics"]["val/loss_epoch"] == 2.125
