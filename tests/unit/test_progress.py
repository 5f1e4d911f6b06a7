"""Live progress: the in-pod tracker on speculators' log lines, the operator's reading of the progress line
(garbage in, nothing used), and the merge into status.progress."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from speculator_operator.api.common import stamp
from speculator_operator.api.podcontract import PROGRESS_PREFIX, parse_progress
from speculator_operator.planning import progress
from speculator_operator.pods.progress import Tracker

# what speculators 0.9.0 prints (train/trainer.py's metric_logger mappings, flattened and formatted by
# train/logger.py's FormatDictFilter; RichHandler's time, level and source columns around them)
STEP = ("[10:00:01] INFO     train/loss=2.341, train/full_acc_0=0.125, train/full_acc_1=3.00e-04, "
        "profile/tokens_per_s=1.20e+04, epoch=0, lr=3.00e-04, global_step={step}      trainer.py:587")  # fmt: skip
VAL = "[10:05:00] INFO     val/loss_epoch=2.104, val/full_acc_0_epoch=0.210, epoch=0      trainer.py:671"


def test_the_tracker_follows_steps_epochs_loss_and_validation() -> None:
    t = Tracker("train")
    t.line("[10:00:00] INFO     Training epoch 1/3 started          trainer.py:737")
    for step in (0, 10, 20):
        t.line(STEP.format(step=step))
    t.line("[10:04:59] INFO     Training epoch 1/3 completed          trainer.py:739")
    t.line(VAL)
    snap = t.snapshot()
    assert (snap["stage"], snap["step"], snap["epoch"], snap["epochs"], snap["epochsCompleted"]) == (
        "train", 20, 1, 3, 1)  # fmt: skip
    assert snap["loss"] == 2.341
    assert snap["metrics"]["train/full_acc_1"] == 3e-4
    assert snap["metrics"]["val/loss_epoch"] == 2.104
    assert "profile/tokens_per_s" not in snap["metrics"]  # train/* and val/* only
    assert snap["etaSeconds"] >= 0  # 21 steps an epoch, 3 epochs: the rest at the rate seen
    line = t.render()
    assert line.startswith(PROGRESS_PREFIX)
    assert parse_progress(f"other output\n{line}\nmore output", "train") == {
        k: v for k, v in snap.items() if k != "stage"
    }


def test_regenerate_counts_its_outfile_and_estimates_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "data.jsonl"
    t = Tracker("regenerate", total=10, output=out)
    t.poll()
    assert "samples" not in t.snapshot()
    out.write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    t.poll()
    snap = t.snapshot()
    assert (snap["samples"], snap["samplesTarget"]) == (3, 10)
    assert snap["etaSeconds"] >= 0


def test_prepare_reads_its_progress_bar() -> None:
    t = Tracker("prepare")
    t.line("Tokenizing: 45%|████▌     | 450/1000 [00:03<00:04, 130.2 examples/s]")
    assert (t.snapshot()["samples"], t.snapshot()["samplesTarget"]) == (450, 1000)


GARBAGE = [
    "speculators-progress {not json",
    'speculators-progress ["a", "list"]',
    'speculators-progress {"stage": "prepare", "samples": 5}',  # another stage's line
    'speculators-progress {"stage": "train", "step": -1, "epoch": true, "loss": NaN, "samples": 1e300}',
    'speculators-progress {"stage": "train", "metrics": {"x": "high", "y": Infinity}, "etaSeconds": "soon"}',
    "speculators-progress " + json.dumps({"stage": "train", "step": 1, "pad": "x" * 5000}),  # too long
]


def test_a_pod_that_reports_garbage_gives_nothing_or_only_what_checks_out() -> None:
    assert parse_progress("\n".join(GARBAGE[:3]), "train") is None
    assert parse_progress(GARBAGE[3], "train") == {}
    assert parse_progress(GARBAGE[4], "train") == {}
    assert parse_progress(GARBAGE[5], "train") is None
    good = 'speculators-progress {"stage": "train", "step": 7, "loss": 1.5, "metrics": {"train/loss": 1.5}}'
    assert parse_progress("\n".join([good, *GARBAGE]), "train") == {}  # the last line of the stage wins
    assert parse_progress("\n".join([*GARBAGE, good]), "train") == {"step": 7, "loss": 1.5,
                                                                    "metrics": {"train/loss": 1.5}}  # fmt: skip


def test_the_merge_keeps_what_ended_stages_reported_and_moves_updated_only_on_change() -> None:
    t = [datetime(2099, 1, 1, 0, 0, i, tzinfo=UTC) for i in range(4)]
    old = {"samplesTotal": 16, "stage": "prepare", "samples": 16, "updated": stamp(t[0])}
    new = progress.merged(old, {"step": 3, "epoch": 1, "epochs": 2}, "train", t[1])
    assert new == {"samplesTotal": 16, "stage": "train", "step": 3, "epoch": 1, "epochs": 2,
                   "updated": "2099-01-01T00:00:01Z"}  # fmt: skip
    assert progress.merged(new, {"step": 3}, "train", t[2]) == new  # nothing moved: no new `updated`
    later = progress.merged(new, {"step": 9, "epochsCompleted": 1}, "train", t[3])
    assert (later["step"], later["epoch"], later["updated"]) == (9, 1, "2099-01-01T00:00:03Z")
    assert progress.epochs_ended(new, later) == [1]
    assert progress.epochs_ended(later, later) == []
    assert progress.epochs_ended(old, {**later, "epochsCompleted": 2}) == [1, 2]


def test_the_log_read_is_rank_0s_on_a_node_that_may_be_dialled() -> None:
    def pod(name: str, phase: str, host: str, index: str | None = None) -> dict[str, object]:
        annotations = {progress.COMPLETION_INDEX: index} if index is not None else {}
        return {"metadata": {"name": name, "annotations": annotations}, "status": {"phase": phase, "hostIP": host}}

    def ours(ip: str) -> bool:
        return ip.startswith("10.250.")

    pods = [pod("r2", "Running", "10.250.0.2", "2"), pod("r0", "Running", "10.250.0.2", "0"),
            pod("done", "Succeeded", "10.250.0.2", "1"), pod("fake", "Running", "10.0.0.2", "0")]  # fmt: skip
    chosen = progress.stage_pod(pods, ours)
    assert chosen is not None
    assert chosen["metadata"]["name"] == "r0"
    assert progress.stage_pod([pods[3]], ours) is None  # kwok's node: the API server would dial 10.0.0.2
    assert progress.stage_pod([pods[2]], ours) is None


def test_each_epoch_that_ended_is_one_event_with_its_loss() -> None:
    old = {"stage": "train", "epochsCompleted": 1}
    new = {"stage": "train", "epochsCompleted": 3, "epochs": 4, "loss": 1.23456}
    assert progress.epoch_events(old, new) == [
        ("EpochCompleted", "epoch 2/4 completed, train/loss 1.235"),
        ("EpochCompleted", "epoch 3/4 completed, train/loss 1.235"),
    ]
    assert progress.epoch_events(new, new) == []


def test_a_log_is_read_only_for_a_run_in_flight_in_a_stage_that_prints_progress() -> None:
    assert progress.reading_due({"phase": "Training", "stage": "train"})
    assert progress.reading_due({"phase": "Regenerating", "stage": "regenerate"})
    assert not progress.reading_due({"phase": "Auditing", "stage": "audit"})  # prints no progress line
    assert not progress.reading_due({"phase": "Evaluating", "stage": "evaluate"})
    assert not progress.reading_due({"phase": "Failed", "stage": "train"})  # the failed stage's pod is done
    assert not progress.reading_due({})
