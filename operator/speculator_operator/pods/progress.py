"""Live progress of a SpeculatorTrainJob stage, the pod's half: the trainer entrypoint reads the tool's output
as it relays it (and counts what the stage wrote) and every few seconds prints one progress line (its format:
api/podcontract.py) to the same log. The operator's half, which reads it: planning/progress.py.

What speculators 0.9.0 prints while it trains (train/trainer.py, train/logger.py): the metric logger's
mappings, flattened with "/" and formatted by FormatDictFilter as `key=value, ...` (floats as %.3f, or %.2e
outside [0.001, 999]), one line per logged step: `train/<metric>=..., ..., epoch=E, lr=..., global_step=S`
(E counts from 0), and after each epoch's validation `val/<metric>_epoch=..., epoch=E`; the root logger says
`Training epoch i/n started` and `... completed` (i counts from 1). Rich prints them: without a terminal it
wraps at 80 columns unless COLUMNS is set, so the entrypoint sets COLUMNS for the tool.
"""

from __future__ import annotations

import math
import re
import threading
import time
from pathlib import Path
from typing import Any

from speculator_operator.api.podcontract import PROGRESS_MAX_METRICS as MAX_METRICS
from speculator_operator.api.podcontract import progress_line

_PAIR = re.compile(r"(?:^|[\s,])((?:train|val)/[\w./-]{1,64})=(-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)")
_STEP = re.compile(r"\bglobal_step=(\d+)")
_EPOCH_FIELD = re.compile(r"\bepoch=(\d+)")
_EPOCH_LINE = re.compile(r"Training epoch (\d+)/(\d+) (started|completed)")
_TQDM = re.compile(r"(\d+)/(\d+) \[")


class Tracker:
    """What the running stage has done so far (in the pod): fed the tool's output line by line, and asked
    for a snapshot every few seconds. `files` counts what the stage has written: regenerate's outfile rows,
    extract's hidden-state files."""

    def __init__(self, stage: str, total: int | None = None, output: Path | None = None) -> None:
        self.stage, self.total, self.output = stage, total, output
        self.started = time.monotonic()
        self.step: int | None = None
        self.epoch: int | None = None  # the epoch running, from 1
        self.epochs: int | None = None
        self.epochs_completed = 0
        self.samples: int | None = None
        self.loss: float | None = None
        self.metrics: dict[str, float] = {}
        self._steps_per_epoch: int | None = None
        self._first: tuple[float, int] | None = None  # (when, step) of the first step seen: the rate
        self._lock = threading.Lock()  # fed by a reader thread per output stream

    def line(self, text: str) -> None:
        with self._lock:
            self._line(text)

    def _line(self, text: str) -> None:
        found = _EPOCH_LINE.search(text)
        if found:
            self.epochs = int(found[2])
            if found[3] == "started":
                self.epoch = int(found[1])
            else:
                self.epochs_completed = max(self.epochs_completed, int(found[1]))
                if self._steps_per_epoch is None and self.step is not None and self.epochs_completed == 1:
                    self._steps_per_epoch = self.step + 1
            return
        step = _STEP.search(text)
        pairs = _PAIR.findall(text)
        if step or pairs:
            if step:
                self.step = int(step[1])
                if self._first is None:
                    self._first = (time.monotonic(), self.step)
            epoch = _EPOCH_FIELD.search(text)
            if epoch and self.epoch is None:
                self.epoch = int(epoch[1]) + 1
            for key, value in pairs:
                number = float(value)
                if not math.isfinite(number):
                    continue
                if key == "train/loss":
                    self.loss = number
                if key in self.metrics or len(self.metrics) < MAX_METRICS:
                    self.metrics[key] = number
            return
        if self.stage == "prepare":
            bar = _TQDM.search(text)
            if bar and int(bar[2]) > 0:
                self.samples, self.total = int(bar[1]), int(bar[2])

    def poll(self) -> None:
        """Count what the stage has written so far."""
        out = self.output
        if out is None:
            return
        try:
            if self.stage == "regenerate" and out.is_file():
                with out.open("rb") as fh:
                    self.samples = sum(1 for _ in fh)
            elif self.stage == "extract" and out.is_dir():
                self.samples = sum(1 for _ in out.glob("hs_*.safetensors"))
        except OSError:
            return

    def eta_seconds(self) -> float | None:
        now = time.monotonic()
        if self.samples is not None and self.total and self.samples > 0:
            rate = self.samples / max(now - self.started, 1e-3)
            return max(self.total - self.samples, 0) / rate
        if self._first is not None and self.step is not None and self._steps_per_epoch and self.epochs:
            done = self.step - self._first[1]
            if done > 0:
                rate = done / max(now - self._first[0], 1e-3)
                return max(self._steps_per_epoch * self.epochs - (self.step + 1), 0) / rate
        return None

    def snapshot(self) -> dict[str, Any]:
        eta = self.eta_seconds()
        out: dict[str, Any] = {
            "stage": self.stage,
            "samples": self.samples,
            "samplesTarget": self.total,
            "step": self.step,
            "epoch": self.epoch,
            "epochs": self.epochs,
            "epochsCompleted": self.epochs_completed or None,
            "loss": self.loss,
            "metrics": dict(self.metrics) or None,
            "etaSeconds": None if eta is None else round(eta),
        }
        return {k: v for k, v in out.items() if v is not None}

    def render(self) -> str:
        with self._lock:
            return progress_line(self.snapshot())
