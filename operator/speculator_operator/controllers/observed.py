"""A deployment's child and serving pods as the watches last showed them, held in the event loop for the
owner's next pass (the rules, and why: planning/watched.py). The pass takes what is held when it starts, as it
takes the drifts (controllers/drift.py) and the scrape's judgement (controllers/telemetry.py); what arrives
during a pass is held for the one more pass that its event asks for."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from speculator_operator.planning.watched import serving_inputs, trimmed_child
from speculator_operator.runtime import metrics

Key = tuple[str, str]  # the owner's (namespace, name)


@dataclass(frozen=True)
class Seen:
    """The child as its latest event showed it (None: no child event since the last pass) and the serving pods
    the pod watch had then (trimmed: planning/watched.py)."""

    child: dict[str, Any] | None
    pods: list[dict[str, Any]]


_inputs: dict[str, tuple[Any, ...]] = {}  # child uid -> what serving_status read of it at its last event or apply
_lock = threading.Lock()  # the event loop and the passes' apply both set it
metrics.tracked("deployment.children", lambda: len(_inputs))
_held: dict[Key, Seen] = {}
metrics.tracked("deployment.seen", lambda: len(_held))


def moved(child: Mapping[str, Any], type: str) -> bool:
    """Whether a child's event changes what the serving counts read of it (its first event since the operator
    started always does); a deleted child's entry is dropped."""
    uid = str((child.get("metadata") or {}).get("uid") or "")
    now = serving_inputs(child)
    with _lock:
        if type == "DELETED":
            _inputs.pop(uid, None)
            return True
        if _inputs.get(uid) == now:
            return False
        _inputs[uid] = now
        return True


def applied(child: Mapping[str, Any]) -> None:
    """A pass applied this child (the API server's answer): the watch's echo of that same object asks for no
    pass of its own. The pass planned from what it read; the child's controller always answers a new
    generation with a status of its own, whose event asks for one, and an apply that leaves the generation as it
    was (metadata only) leaves the revision and the counts as the pass read them."""
    uid = str((child.get("metadata") or {}).get("uid") or "")
    if uid:
        with _lock:
            _inputs[uid] = serving_inputs(child)


def hold(key: Key, pods: Iterable[dict[str, Any]], child: Mapping[str, Any] | None = None) -> None:
    """Hold the pods as watched now and, given one, the child (else the child held before, if any)."""
    before = _held.get(key)
    kept = trimmed_child(child) if child is not None else (before.child if before is not None else None)
    _held[key] = Seen(kept, list(pods))


def take(key: Key) -> Seen | None:
    return _held.pop(key, None)


def forget(key: Key) -> None:
    _held.pop(key, None)


def clear() -> None:
    _held.clear()
    _inputs.clear()
