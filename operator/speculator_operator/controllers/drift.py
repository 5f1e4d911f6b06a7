"""Children changed or deleted by hand, as the operator process sees them: a child's event that shows another
manager owning part of its spec, or its deletion, is held for its owner's next pass (the pass reads the child
again: the event may be stale); the pass applies its children with force, each against the object it read,
and says which it restored. What other managers still own after that (an extra env var, say) is theirs: it
is remembered from the apply's own answer, so an edit landing after the apply is never mistaken for it.
The judgement itself is pure (planning/drift.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from speculator_operator.planning.drift import edited_by, fingerprint, taken_from
from speculator_operator.runtime import metrics
from speculator_operator.runtime.inbox import Inbox
from speculator_operator.runtime.kube import FIELD_MANAGER, Applied, read_child

Ref = tuple[str, str]  # (kind, name): how a pass's children are keyed
Drift = tuple[str, str, str, str, str]  # (apiVersion, kind, namespace, name, event type)

# children whose other managers own only what the operator does not set: {uid: planning.drift.fingerprint}
_theirs: dict[str, str] = {}
metrics.tracked("deployment.drift", lambda: len(_theirs))
# children that may have been changed by hand, per owner, held for its next pass: the event loop puts, the pass
# takes on a work queue's thread
_held: Inbox[tuple[str, str], list[Drift]] = Inbox("deployment.drifts")


class Restoring(NamedTuple):
    """Why a pass restores, per child, as its read said (the apply reads each child again right before it)."""

    why: dict[Ref, str]


def hold(body: Mapping[str, Any], namespace: str, owner: str, type: str) -> bool:
    """A child deleted, or one whose spec another manager owns part of: held for its owner's next pass. False
    when the event says neither."""
    meta = body.get("metadata") or {}
    if type == "DELETED":
        _theirs.pop(meta.get("uid") or "", None)
    elif not edited_by(body, FIELD_MANAGER):
        return False
    drift = (str(body.get("apiVersion") or ""), str(body.get("kind") or "child"), namespace, str(meta.get("name")),
             type)  # fmt: skip
    _held.update((namespace, owner), lambda held: held if held and drift in held else [*(held or ()), drift])
    return True


def take(key: tuple[str, str]) -> list[Drift]:
    """The drifts held for an owner, handed to its pass (and no longer held)."""
    return _held.take(key) or []


def keep(key: tuple[str, str], drifts: list[Drift]) -> None:
    """Hold `drifts` again for the owner's next pass (its restoration did not go through: a child kept moving),
    ahead of any held since."""
    if drifts:
        _held.update(key, lambda held: [*drifts, *(d for d in held or () if d not in drifts)])


def forget(key: tuple[str, str]) -> None:
    _held.forget(key)


def clear() -> None:
    _held.clear()


def restoring(drifts: list[Drift]) -> Restoring | None:
    """The drifted children as they are now, with why each is restored (deleted, or changed by whom), or None
    when none is: every event was stale, or what others own is known to be theirs."""
    why: dict[Ref, str] = {}
    read: set[Ref] = set()
    for api_version, kind, namespace, name, _ in drifts:
        ref = (kind, name)
        if ref in read:
            continue
        read.add(ref)
        now = read_child(api_version, kind, namespace, name)
        if now is None:
            why[ref] = f"{kind} {name} was deleted"
            continue
        who = edited_by(now, FIELD_MANAGER)
        if who is not None and _theirs.get(now["metadata"]["uid"]) != fingerprint(now, FIELD_MANAGER):
            why[ref] = f"{kind} {name} was changed by {who}"
    return Restoring(why) if why else None


def restored(what: Restoring, applied: Mapping[Ref, Applied]) -> str | None:
    """After a restoring apply: the words for what it took back, child by child (None: nothing, what others
    changed is theirs to keep), and what other managers still own of each child remembered as theirs. Told
    from the apply's own before and after, so an edit that landed after the drift's event and before the apply
    is said too, and never twice (its own event, when the pass it asks for reads the child, finds it ours)."""
    said = []
    for (kind, name), (before, after) in applied.items():
        if before is None:
            said.append(what.why.get((kind, name)) or f"{kind} {name} was missing")
        elif who := taken_from(before, after, FIELD_MANAGER):
            said.append(f"{kind} {name} was changed by {', '.join(who)}")
        if edited_by(after, FIELD_MANAGER):
            _theirs[after["metadata"]["uid"]] = fingerprint(after, FIELD_MANAGER)
    return "; ".join(said) if said else None
