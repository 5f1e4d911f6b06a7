"""The evaluate stage's held-out samples, split off at the end of prepare (inside the trainer image, where
`datasets` is): n samples, drawn with a fixed seed by datasets' own `train_test_split`, leave the prepared
dataset before extraction and training see it; their prompts (the tokens before the first one the loss
counts: the conversation as the chat template rendered it, up to the first answer) go to a JSON-lines file
for the evaluate stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SEED = 0


class EvaluationError(Exception):
    """Bad input for the evaluation (exit 2)."""


def prompt_of(input_ids: list[int], loss_mask: list[int]) -> list[int]:
    """The tokens before the first one the loss counts (the whole sample when none counts)."""
    first = next((i for i, m in enumerate(loss_mask) if m), len(input_ids))
    return [int(t) for t in input_ids[: max(first, 1)]]


def check_count(rows: int, count: int) -> None:
    if count >= rows:
        raise EvaluationError(
            f"prepare-data made {rows} sample(s): evaluation.heldOut {count} must leave some to train on"
        )


def hold_out(prepared: Path, count: int, dest: Path) -> tuple[int, int]:
    """Split `count` samples off the prepared dataset (rewritten in place, token_freq.pt kept) and write their
    prompts to `dest`; returns (kept, held out)."""
    from datasets import load_from_disk  # type: ignore[import-not-found]  # in the trainer image

    ds = load_from_disk(str(prepared))
    check_count(len(ds), count)
    split = ds.train_test_split(test_size=count, seed=SEED)  # datasets' own seeded draw
    rows = [prompt_of(list(r["input_ids"]), list(r["loss_mask"])) for r in split["test"]]
    kept = split["train"]
    staging = prepared.with_name(prepared.name + ".kept")
    shutil.rmtree(staging, ignore_errors=True)
    kept.save_to_disk(str(staging))
    for f in prepared.iterdir():
        if f.suffix == ".arrow" or f.name in ("dataset_info.json", "state.json"):
            f.unlink()
    for f in staging.iterdir():
        shutil.move(str(f), prepared / f.name)
    staging.rmdir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(json.dumps({"prompt_token_ids": ids}) + "\n" for ids in rows))
    return len(kept), len(rows)
