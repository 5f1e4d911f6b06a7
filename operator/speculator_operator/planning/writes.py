"""What a pass asks to be written, as data: the planners and the passes build it, one executor
(runtime/executor.py) carries it out and says what happened. Pure.

A plan's writes go in one order: the apply, then the deletes, the creates and the S3 deletes; an apply the API
server refuses (or one into a namespace being deleted) stops the rest, and the plan's events are said only when
every write went through. Events are posted at the end of the pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Event(NamedTuple):
    """A Kubernetes Event about the pass's object (a plain `(type, reason, message)` tuple is one too)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Apply:
    """Server-side apply of the rendered children (runtime/kube.apply_children): `force` for a restoration, `known`
    the children this pass has just read, by (kind, name), None for one read as absent."""

    children: list[dict[str, Any]]
    force: bool = False
    known: Mapping[tuple[str, str], dict[str, Any] | None] | None = None


@dataclass(frozen=True)
class Delete:
    """A child of the object's namespace to delete; one already gone is no error."""

    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class Create:
    """One of the project's own objects to create in the object's namespace (a retrain's SpeculatorTrainJob): its
    plural and manifest; one that exists already is a conflict, not an error."""

    plural: str
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class DeleteFolders:
    """Published folders under an s3:// output to delete (output.keepLatest: planning/retention.py), with the
    credentials the pass read for the bucket (None: the default chain)."""

    uris: tuple[str, ...]
    credentials: Mapping[str, str] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Writes:
    """One plan of writes: carried out in this order, the events said only when every write went through."""

    apply: Apply | None = None
    deletes: tuple[Delete, ...] = ()
    creates: tuple[Create, ...] = ()
    folders: DeleteFolders | None = None
    events: tuple[tuple[str, str, str], ...] = ()


def deletes(refs: list[tuple[str, str, str]]) -> tuple[Delete, ...]:
    """(apiVersion, kind, name) triples, as the planners list them, as deletes."""
    return tuple(Delete(*ref) for ref in refs)
