"""Live progress of a SpeculatorTrainJob stage, on both sides of the pod log.

In the pod, the trainer entrypoint reads the tool's output as it relays it (and counts what the stage wrote)
and every few seconds prints one line `speculators-progress {json}` to the same log. The operator reads the
running stage pod's log tail (`pods/log`: no right to patch anything of the pod) and takes the last such line
it can trust. A pod can print anything: a line that does not parse, or holds values out of range, is not used.

What speculators 0.9.0 prints while it trains (train/trainer.py, train/logger.py): the metric logger's
mappings, flattened with "/" and formatted by FormatDictFilter as `key=value, ...` (floats as %.3f, or %.2e
outside [0.001, 999]), one line per logged step: `train/<metric>=..., ..., epoch=E, lr=..., global_step=S`
(E counts from 0), and after each epoch's validation `val/<metric>_epoch=..., epoch=E`; the root logger says
`Training epoch i/n started` and `... completed` (i counts from 1). Rich prints them: without a terminal it
wraps at 80 columns unless COLUMNS is set, so the entrypoint sets COLUMNS for the tool.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREFIX = "speculators-progress "
MAX_LINE = 4096  # a progress line longer than this is not one of ours
MAX_METRICS = 16
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
            return PREFIX + json.dumps(self.snapshot(), separators=(",", ":"), sort_keys=True)


_INTS = ("samples", "samplesTarget", "step", "epoch", "epochs", "epochsCompleted", "etaSeconds")
LIMIT = 10**12


def parse(text: str, stage: str) -> dict[str, Any] | None:
    """The last trustworthy progress line of `stage` in a log tail (None: there is none). Garbage, in part or
    whole, is dropped: an unknown key, a value of the wrong type or out of range, another stage's line."""
    for raw in reversed(text.splitlines()):
        at = raw.find(PREFIX)
        if at < 0 or len(raw) - at > MAX_LINE:
            continue
        try:
            found = json.loads(raw[at + len(PREFIX) :])
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("stage") == stage:
            return _clean(found)
    return None


def _clean(found: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _INTS:
        value = found.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < LIMIT:
            out[key] = value
    loss = found.get("loss")
    if isinstance(loss, int | float) and not isinstance(loss, bool) and math.isfinite(loss):
        out["loss"] = float(loss)
    metrics = found.get("metrics")
    if isinstance(metrics, dict):
        kept = {
            str(k)[:64]: float(v)
            for k, v in list(metrics.items())[:MAX_METRICS]
            if isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if kept:
            out["metrics"] = kept
    return out


# ---- the operator's side: what goes into status.progress ---------------------------------------------------

LIVE = frozenset({*_INTS, "stage", "loss", "metrics", "updated"})


def merged(old: dict[str, Any] | None, parsed: dict[str, Any], stage: str, now: str) -> dict[str, Any]:
    """status.progress with a running stage's live report in it: the report's values replace the last
    stage's live ones (what the finished stages reported stays), `updated` moves only when something did."""
    before = dict(old or {})
    live = {k: v for k, v in before.items() if k not in LIVE}
    if before.get("stage") == stage:  # the same stage: what it no longer reports stays as last seen
        live.update({k: v for k, v in before.items() if k in LIVE and k != "updated"})
    live.update(parsed, stage=stage)
    unchanged = {k: v for k, v in before.items() if k != "updated"} == live
    live["updated"] = before.get("updated") if unchanged and "updated" in before else now
    return live


def epochs_ended(old: dict[str, Any] | None, new: dict[str, Any]) -> list[int]:
    """The epochs whose end the new report is the first to show (an event each)."""
    if new.get("stage") != "train":
        return []
    before = (old or {}).get("epochsCompleted") if (old or {}).get("stage") == "train" else 0
    return list(range(int(before or 0) + 1, int(new.get("epochsCompleted") or 0) + 1))


def epoch_events(old: dict[str, Any] | None, new: dict[str, Any]) -> list[tuple[str, str]]:
    """An event (reason, message) for each epoch whose end the new report is the first to show."""
    loss = new.get("loss")
    tail = f", train/loss {loss:.4g}" if isinstance(loss, float) else ""
    return [
        ("EpochCompleted", f"epoch {epoch}/{new.get('epochs', '?')} completed{tail}")
        for epoch in epochs_ended(old, new)
    ]


LIVE_STAGES = frozenset({"regenerate", "prepare", "extract", "train"})  # the stages that print progress lines


def reading_due(status: dict[str, Any]) -> bool:
    """Whether a train job's running stage has a progress line to read: a run in flight, in a stage that
    prints one."""
    return status.get("phase") not in ("Succeeded", "Failed") and status.get("stage") in LIVE_STAGES


COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def stage_pod(pods: list[dict[str, Any]], dialable: Callable[[str], bool]) -> dict[str, Any] | None:
    """The stage pod whose log to read: a running one (rank 0 of an Indexed Job first) on a node that may be
    dialled, since the API server fetches a log from the pod's node (kwok's fake nodes may not be)."""
    running = [
        p for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and dialable(str(p["status"].get("hostIP") or ""))
    ]  # fmt: skip
    return min(running, key=_completion_index, default=None)


def _completion_index(pod: dict[str, Any]) -> int:
    index = str(((pod.get("metadata") or {}).get("annotations") or {}).get(COMPLETION_INDEX, "0"))
    return int(index) if index.isdigit() else 0
