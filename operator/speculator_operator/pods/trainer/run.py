"""`trainer run --stage S -- CMD...`: run the stage's real tool (`speculators ...`, `torchrun ...`), forward
SIGTERM to it (speculators saves `interrupted/` on SIGTERM), relay its output while printing the progress line,
and on success leave the stage's report (samples, epoch, data fingerprint) for the operator's status. On
failure nothing is written, so Kubernetes keeps the log tail instead (FallbackToLogsOnError)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from speculator_operator.adapters.checkpoints import checkpoint_dir
from speculator_operator.api.podcontract import progress_seconds
from speculator_operator.domain.algorithms import Algorithm, Family, in_family
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.checkpoint.safetensors_header import header_length, parse_header
from speculator_operator.pods import progress
from speculator_operator.pods.trainer.report import expand, flag, report


def run(stage: str, command: list[str], held_out: tuple[int, str] | None = None) -> int:
    """Run the stage's tool; `held_out` (prepare only): split that many samples off into that file."""
    if not command:
        print("trainer run: no command after --", file=sys.stderr)
        return 2
    command = expand(command)
    if stage == "stitch":
        try:
            command = _stitched_from(command)
        except CheckpointError as exc:
            print(f"trainer: stage stitch: {exc}", file=sys.stderr)
            return 2
    print(f"trainer: stage {stage}: {' '.join(command)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    tracker = _tracker(stage, command)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "1000")}  # rich wraps at 80 without a terminal
    try:
        # the rendered command of this stage; its output is read on its way through to the log (see _relay)
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    except OSError as exc:
        print(f"trainer: cannot start {command[0]}: {exc}", file=sys.stderr)
        return 2
    unfilled: list[str] = []
    readers = [
        threading.Thread(target=_relay, args=(stream, sink, tracker, unfilled), daemon=True)
        for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
    ]
    for reader in readers:
        reader.start()
    stop = threading.Event()
    ticker = threading.Thread(target=_report_progress, args=(tracker, stop), daemon=True)
    ticker.start()

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    for reader in readers:
        reader.join(timeout=60)
    stop.set()
    ticker.join(timeout=10)
    tracker.poll()
    print(tracker.render(), file=sys.stderr, flush=True)
    if code != 0:
        print(f"trainer: stage {stage} exited with {code}", file=sys.stderr)
        return code if code > 0 else 128 - code
    if unfilled:
        print(f"trainer: stage convert: the converter loaded the source only in part, so the draft it saved holds "
              f"weights the source did not give; {'; '.join(unfilled)}", file=sys.stderr)  # fmt: skip
        return 1
    if stage == "convert":
        for note in causal_as_trained(Path(flag(command, "--output-path") or "converted")):
            print(f"trainer: stage convert: {note}", file=sys.stderr)
    extra: dict[str, Any] = {}
    if held_out is not None:
        from speculator_operator.pods.holdout import EvaluationError, hold_out

        try:
            kept, held = hold_out(Path(flag(command, "--output") or "./output"), held_out[0], Path(held_out[1]))
        except EvaluationError as exc:
            print(f"trainer: stage {stage}: {exc}", file=sys.stderr)
            return 2
        print(f"trainer: stage {stage}: {held} sample(s) held out for evaluate, {kept} to train on", file=sys.stderr)
        extra = {"samples": kept, "heldOut": held}  # dataset_info.json may still count the rows before the split
    report(stage, seconds=round(time.monotonic() - t0, 1), **{**outcome(stage, command), **extra})
    return 0


# speculators 0.9.0's eagle3 converter loads the source with strict=False and only warns about what did not fit
# (convert/eagle/eagle3_converter.py _save_converted_checkpoint): a tensor the source lacks stays randomly
# initialised, and one it has that the draft does not use is dropped.
_PARTIAL_LOAD = re.compile(r"(Missing|Unexpected) keys in checkpoint: (.*)")


def _relay(stream: IO[str], sink: IO[str], tracker: progress.Tracker, unfilled: list[str]) -> None:
    """Copy one of the tool's streams through, feeding the progress tracker and noting each part of a
    source the converter could not place."""
    for line in stream:
        sink.write(line)
        sink.flush()
        tracker.line(line)
        match = _PARTIAL_LOAD.search(line)
        if match and tracker.stage == "convert":
            unfilled.append(f"{match[1].lower()} keys: {match[2][:300]}")


PROGRESS_SECONDS = progress_seconds()


def _report_progress(tracker: progress.Tracker, stop: threading.Event) -> None:
    """Print the stage's progress line when it changed, every PROGRESS_SECONDS (the operator reads the last)."""
    last = ""
    while not stop.wait(PROGRESS_SECONDS):
        tracker.poll()
        line = tracker.render()
        if line != last:
            print(line, file=sys.stderr, flush=True)
            last = line


def _tracker(stage: str, command: list[str]) -> progress.Tracker:
    limit = flag(command, "--limit")
    total = int(limit) if limit and limit.isdigit() else None
    if stage == "regenerate":
        return progress.Tracker(stage, total, Path(flag(command, "--outfile") or "data.jsonl"))
    if stage == "extract":
        samples = flag(command, "--max-samples")
        return progress.Tracker(stage, int(samples) if samples and samples.isdigit() else None,
                                Path(flag(command, "--output") or "."))  # fmt: skip
    return progress.Tracker(stage)


def causal_as_trained(folder: Path) -> list[str]:
    """A converted DFlash draft whose layers all have full attention (z-lab's own drafts) was trained
    non-causal inside each block, and speculators runs full attention non-causal whatever its
    sliding_window_non_causal says; vLLM 0.32.0 instead reads that flag for every layer (dflash_config.causal =
    not the flag) and would serve the draft causal. The converter writes the flag false: it is set true, which
    changes nothing for speculators and makes vLLM serve the draft as it was trained. Returns what was done."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    layers = (config.get("transformer_layer_config") or {}).get("layer_types")
    if (
        not in_family(config.get("speculators_model_type"), Family.DFLASH)
        or config.get("speculators_model_type") == Algorithm.XPRESS
        or config.get("sliding_window_non_causal") is not False
        or not isinstance(layers, list)
        or not layers
        or "sliding_attention" in layers
    ):
        return []
    config["sliding_window_non_causal"] = True
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [
        f"sliding_window_non_causal set true: all {len(layers)} layers have full attention, which the source "
        "and speculators run non-causal and vLLM serves causal under false"
    ]


# speculators 0.9.0's MTP converter saves `verifier_lm_head.weight` (a frozen copy of the verifier's head) with
# the MTP layers, and stitch-mtp skips only embed_tokens and lm_head (cli/stitch.py _FROZEN_KEYS): the copy
# lands in the stitched model, where vLLM 0.32.0 finds no such parameter and refuses to load it (seen here).
# They are the verifier's own weights, never trained: left out of what is stitched.
NOT_STITCHED = re.compile(r"^verifier_(lm_head|norm)\.")


def _stitched_from(command: list[str]) -> list[str]:
    """`speculators stitch-mtp ROOT ...` with ROOT resolved to the run's checkpoint (best, last epoch, or the
    folder a dry run or a convert wrote), less the verifier's frozen copies (NOT_STITCHED)."""
    if command[:2] != ["speculators", "stitch-mtp"] or len(command) < 3:
        return command
    root = Path(command[2])
    folder = checkpoint_dir(root)
    clean = root.with_name(root.name + "-stitch-input")
    dropped = copy_without(folder, clean, NOT_STITCHED)
    if dropped:
        print(f"trainer: stage stitch: left out the verifier's frozen {', '.join(dropped)}", file=sys.stderr)
        folder = clean
    return [*command[:2], str(folder), *command[3:]]


def copy_without(folder: Path, dest: Path, names: re.Pattern[str]) -> list[str]:
    """Copy a single-file checkpoint to `dest` without the tensors whose names match (a byte copy of the
    others, their header rewritten); returns what was left out, and copies nothing when that is none."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return []  # sharded: stitch-mtp reads it as it is
    with weights.open("rb") as fh:
        prefix = fh.read(8)
        size = weights.stat().st_size
        raw = fh.read(header_length(prefix, str(weights), size))
    tensors, metadata = parse_header(raw, str(weights), size)
    dropped = sorted(n for n in tensors if names.match(n))
    if not dropped:
        return []
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("model.safetensors"))
    kept = sorted((t for n, t in tensors.items() if n not in dropped), key=lambda t: t.start)
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for t in kept:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    table = json.dumps(header, separators=(",", ":")).encode()
    table += b" " * (-len(table) % 8)
    with weights.open("rb") as src, (dest / "model.safetensors").open("wb") as out:
        out.write(len(table).to_bytes(8, "little") + table)
        for t in kept:
            src.seek(t.start)
            out.write(src.read(t.nbytes))
    return dropped


def outcome(stage: str, command: list[str]) -> dict[str, Any]:
    """What the status shows for a finished stage, read from what the tool wrote."""
    if stage == "prepare":
        out = Path(flag(command, "--output") or "./output")
        return {"samples": _dataset_rows(out), "fingerprint": _dataset_fingerprint(out)}
    if stage == "extract":
        out = Path(flag(command, "--output") or "")
        return {"samples": len(list(out.glob("hs_*.safetensors"))) if out.is_dir() else None}
    if stage == "regenerate":
        out = Path(flag(command, "--outfile") or "")
        return {"samples": sum(1 for _ in out.open()) if out.is_file() else None}
    if stage in ("convert", "stitch"):
        out = Path(flag(command, "--output-path") or "")
        return {
            "checkpoint": str(out),
            "files": sum(1 for p in out.rglob("*") if p.is_file()) if out.is_dir() else None,
        }
    if stage == "train":
        save = Path(flag(command, "--save-path") or "")
        epochs = [int(p.name) for p in save.iterdir() if p.name.isdigit()] if save.is_dir() else []
        return {"epoch": max(epochs) + 1 if epochs else (0 if "--dry-run" in command else None)}
    return {}


def _dataset_fingerprint(out: Path) -> str | None:
    state = out / "state.json"
    try:
        value = json.loads(state.read_text()).get("_fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def _dataset_rows(out: Path) -> int | None:
    try:
        info = json.loads((out / "dataset_info.json").read_text())
        splits = info.get("splits") or {}
        if splits:
            return int(sum(s.get("num_examples", 0) for s in splits.values()))
    except (OSError, ValueError, AttributeError):
        pass
    try:
        from datasets import load_from_disk  # type: ignore[import-not-found]  # in the trainer image

        return len(load_from_disk(str(out)))
    except Exception:  # a count is informative only
        return None
