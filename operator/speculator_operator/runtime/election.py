"""Who runs the controllers: one active operator among replicas, elected through a coordination.k8s.io
Lease (the rules client-go's leader election follows). Pure: the caller reads the Lease, asks `decide`, and
writes what it answers with the Lease's resourceVersion, so that two candidates writing at once cannot
both win (the API server refuses the second with 409 Conflict).

Expiry is judged from when *this* candidate last saw the record change, on its own monotonic clock, never
from the holder's renewTime: the candidates' wall clocks need not agree."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum


@dataclass(frozen=True)
class Record:
    """The Lease's spec, as far as the election reads it."""

    holder: str  # "" when released
    duration_s: int
    acquired: datetime | None = None
    renewed: datetime | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Seen:
    """The record this candidate last observed, and when (monotonic seconds) it first saw it so."""

    record: Record | None
    at: float


class Action(Enum):
    CREATE = "create"  # no Lease yet: make it, holding it
    RENEW = "renew"  # ours: write a fresh renewTime
    TAKE = "take"  # released or expired: write ourselves in
    WAIT = "wait"  # another holder, still current


@dataclass(frozen=True)
class Decision:
    action: Action
    write: Record | None  # what to write (None for WAIT)
    seen: Seen


def observe(seen: Seen | None, current: Record | None, now: float) -> Seen:
    """The observation after reading `current`: its clock restarts only when the record changed."""
    if seen is not None and seen.record == current:
        return seen
    return Seen(current, now)


def expired(seen: Seen, now: float) -> bool:
    record = seen.record
    return record is None or not record.holder or now - seen.at > record.duration_s


def decide(current: Record | None, seen: Seen | None, me: str, duration_s: int, now: float, wall: datetime) -> Decision:
    """What `me` does after reading the Lease (`current`, None when it does not exist)."""
    seen = observe(seen, current, now)
    if current is None:
        return Decision(Action.CREATE, Record(me, duration_s, wall, wall, 0), seen)
    if current.holder == me:
        return Decision(Action.RENEW, replace(current, duration_s=duration_s, renewed=wall), seen)
    if expired(seen, now):
        taken = Record(me, duration_s, wall, wall, current.transitions + 1)
        return Decision(Action.TAKE, taken, seen)
    return Decision(Action.WAIT, None, seen)


def released(current: Record, me: str, wall: datetime) -> Record | None:
    """The record that hands the Lease back on a clean shutdown (a standby takes it at once rather than
    after the lease duration), or None when it is not ours to release."""
    if current.holder != me:
        return None
    return replace(current, holder="", duration_s=1, renewed=wall)
