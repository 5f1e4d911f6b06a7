"""Live progress of a SpeculatorTrainJob stage, the operator's half: it reads the running stage pod's log tail
(`pods/log`: no right to patch anything of the pod), takes the last progress line it can trust (the format and
its parser: api/podcontract.py; a pod can print anything, and a line that does not parse or holds values out of
range is not used) and folds it into `status.progress`. The pod's half, which prints it: pods/progress.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from speculator_operator.api.common import stamp
from speculator_operator.api.labels import COMPLETION_INDEX_ANNOTATION
from speculator_operator.api.podcontract import PROGRESS_FIELDS

COMPLETION_INDEX = COMPLETION_INDEX_ANNOTATION
LIVE = frozenset({*PROGRESS_FIELDS, "updated"})


def merged(old: dict[str, Any] | None, parsed: dict[str, Any], stage: str, now: datetime) -> dict[str, Any]:
    """status.progress with a running stage's live report in it: the report's values replace the last
    stage's live ones (what the finished stages reported stays), `updated` moves only when something did."""
    before = dict(old or {})
    live = {k: v for k, v in before.items() if k not in LIVE}
    if before.get("stage") == stage:  # the same stage: what it no longer reports stays as last seen
        live.update({k: v for k, v in before.items() if k in LIVE and k != "updated"})
    live.update(parsed, stage=stage)
    unchanged = {k: v for k, v in before.items() if k != "updated"} == live
    live["updated"] = before.get("updated") if unchanged and "updated" in before else stamp(now)
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
