"""A deployment's child and serving pods as the watches last showed them, held in the event loop for the
owner's next pass (the rules, and why: planning/watched.py). The pass takes what is held when it starts, as it
takes the drifts (controllers/drift.py) and the scrape's judgement (controllers/telemetry.py); what arrives
during a pass is held for the one more pass that its event asks for.

The serving pods are one kopf index, `serving_pods`, of trimmed pods: the serving counts read it here and the
acceptance scrape (controllers/telemetry.py) takes its targets from it, so each pod is kept once."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import kopf

from speculator_operator.api.labels import DEPLOYMENT_LABEL, MANAGED_BY_LABEL
from speculator_operator.planning.watched import ServingInputs, serving_inputs, trimmed_child, trimmed_pod
from speculator_operator.render.serving import MANAGED_BY
from speculator_operator.runtime import metrics

Key = tuple[str, str]  # the owner's (namespace, name)


@dataclass(frozen=True)
class Seen:
    """The child as its latest event showed it (None: no child event since the last pass) and the serving pods
    the pod watch had then (trimmed: planning/watched.py)."""

    child: dict[str, Any] | None
    pods: list[dict[str, Any]]


SERVING = {MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: kopf.PRESENT}  # the operator's serving children


async def serving_pods(*, namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """(namespace, owner) -> its serving pods, trimmed (planning/watched.trimmed_pod), kept by kopf from the pod
    watch; kopf runs no handler before every index has its first listing, so a child's event finds them all. A
    coroutine: kopf runs a plain function in its handler pool, where every pod event of a burst would wait behind
    the other handlers (the events, whole pods, held meanwhile: at 1,000 resources, the operator's memory peak)."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    return {(namespace, owner): trimmed_pod(body)} if owner and namespace else {}


def pods(kwargs: Mapping[str, Any], key: Key) -> list[dict[str, Any]]:
    """The serving pods of the owner `key` as the index has them now (a handler's kwargs carry the index)."""
    index: kopf.Index[Any, Any] = kwargs["serving_pods"]
    return list(index.get(key, []))


_inputs: dict[str, ServingInputs] = {}  # child uid -> what serving_status read of it at its last event or apply
_lock = threading.Lock()  # the event loop and the passes' apply both set it
metrics.tracked("deployment.children", lambda: len(_inputs))
_held: dict[Key, Seen] = {}
metrics.tracked("deployment.seen", lambda: len(_held))


class Moved(IntEnum):
    """What a child's event changed of what the serving counts read (falsy: nothing)."""

    NOTHING = 0
    INPUTS = 1  # a count, the revision, the observed generation, a ReplicaFailure
    READINESS = 2  # the ready or available count: the pass that follows can make the owner Ready (or not)


def moved(child: Mapping[str, Any], type: str) -> Moved:
    """What a child's event changes of what the serving counts read of it (its first event since the operator
    started always changes them); a deleted child's entry is dropped."""
    uid = str((child.get("metadata") or {}).get("uid") or "")
    now = serving_inputs(child)
    with _lock:
        if type == "DELETED":
            _inputs.pop(uid, None)
            return Moved.READINESS
        before = _inputs.get(uid)
        if before == now:
            return Moved.NOTHING
        _inputs[uid] = now
    return Moved.READINESS if before is not None and before.readiness() != now.readiness() else Moved.INPUTS


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
