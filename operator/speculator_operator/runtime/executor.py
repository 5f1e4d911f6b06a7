"""The one place a pass writes anything but its status: it carries out a plan of writes (planning/writes.py) for
either kind and says what happened, as typed outcomes the pass folds into its one status write
(runtime/controller.PassStatus); the events it was asked to say are posted at the end of the pass, through the
kind's event recorder (runtime/events.py).

What it does not decide: an apply the API server refuses is a `Refused` with the API's answer (the pass says
ApplyFailed), one into a namespace being deleted is `Terminating` (the owner goes with it: nothing to say or
retry), a create that finds the object there already is a `Conflict` (created before: a restart, or an earlier
pass), a delete that finds nothing is `NotFound`. Any other refusal of a delete or a create is raised: the pass
fails and its work queue retries it with back-off."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from speculator_operator.adapters.sources import s3_client
from speculator_operator.domain.checkpoint.manifest import PROVENANCE
from speculator_operator.domain.location import Location
from speculator_operator.planning.writes import Apply, Create, Delete, DeleteFolders, Writes
from speculator_operator.runtime import kube
from speculator_operator.runtime.events import Discarding, EventRecorder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """The apply went through: each child it sent, by (kind, name), before and after (runtime/kube.Applied)."""

    children: Mapping[tuple[str, str], kube.Applied]


@dataclass(frozen=True)
class Refused:
    """The API server refused the apply: its answer."""

    status: int | None
    reason: str | None
    answer: str

    @property
    def message(self) -> str:
        return f"applying the children failed: {self.status} {self.reason}: {self.answer}"


@dataclass(frozen=True)
class Terminating:
    """The apply was refused because the namespace is being deleted."""


@dataclass(frozen=True)
class Deleted:
    ref: Delete


@dataclass(frozen=True)
class NotFound:
    ref: Delete


@dataclass(frozen=True)
class Created:
    name: str


@dataclass(frozen=True)
class Conflict:
    """409: the object exists already."""

    name: str


@dataclass(frozen=True)
class FoldersDeleted:
    uris: tuple[str, ...]


@dataclass(frozen=True)
class FoldersFailed:
    """S3 (or the credentials) refused a delete: what it said. The folders before it in the plan are gone."""

    error: str


@dataclass
class Outcome:
    """What one plan's writes came to."""

    apply: Applied | Refused | Terminating | None = None
    deleted: list[Deleted | NotFound] = field(default_factory=list)
    created: list[Created | Conflict] = field(default_factory=list)
    folders: FoldersDeleted | FoldersFailed | None = None

    @property
    def stopped(self) -> bool:
        """Whether a write did not go through (and so the writes after it, and the plan's events, did not)."""
        return isinstance(self.apply, Refused | Terminating) or isinstance(self.folders, FoldersFailed)

    @property
    def applied(self) -> Mapping[tuple[str, str], kube.Applied]:
        return self.apply.children if isinstance(self.apply, Applied) else {}


class Executor:
    """The writes of one pass of one object (`body`, as the pass read it). `applying(namespace, name)` is called
    just before an apply: the kind's Controller.applying, its documented extension point (runtime/controller.py);
    the events go through `recorder` (the kind's Controller.recorder, runtime/events.py; none: not posted)."""

    def __init__(
        self,
        body: Mapping[str, Any],
        applying: Callable[[str, str], None] | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.body = body
        self.applying = applying
        self.recorder = recorder if recorder is not None else Discarding()
        meta = body["metadata"]
        self.namespace, self.name = str(meta["namespace"]), str(meta["name"])
        self.events: list[tuple[str, str, str]] = []

    def execute(self, writes: Writes) -> Outcome:
        """Carry out `writes` in order; a write that does not go through stops the rest."""
        out = Outcome()
        if writes.apply is not None and writes.apply.children:
            out.apply = self._apply(writes.apply)
            if out.stopped:
                return out
        out.deleted = [self._delete(ref) for ref in writes.deletes]
        out.created = [self._create(create) for create in writes.creates]
        if writes.folders is not None and writes.folders.uris:
            out.folders = self._delete_folders(writes.folders)
            if out.stopped:
                return out
        self.say(*writes.events)
        return out

    def say(self, *events: tuple[str, str, str]) -> None:
        """Events to post at the end of the pass, in this order."""
        self.events.extend(events)

    def post(self) -> None:
        """The end of the pass: its events, posted."""
        for type_, reason, message in self.events:
            self.recorder.event(self.body, type=type_, reason=reason, message=message[:1024])
        self.events.clear()

    def _apply(self, apply: Apply) -> Applied | Refused | Terminating:
        try:
            if self.applying is not None:
                self.applying(self.namespace, self.name)
            return Applied(kube.apply_children(apply.children, force=apply.force, known=apply.known))
        except ApiException as exc:
            if kube.namespace_terminating(exc):
                log.info("%s/%s: not applied, the namespace is being deleted", self.namespace, self.name)
                return Terminating()
            return Refused(exc.status, exc.reason, kube.api_message(exc))

    def _delete(self, ref: Delete) -> Deleted | NotFound:
        found = kube.delete_object(ref.api_version, ref.kind, self.namespace, ref.name)
        return Deleted(ref) if found else NotFound(ref)

    def _create(self, create: Create) -> Created | Conflict:
        try:
            kube.create_custom(create.plural, self.namespace, create.manifest)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return Conflict(create.name)
        return Created(create.name)

    def _delete_folders(self, folders: DeleteFolders) -> FoldersDeleted | FoldersFailed:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3 = s3_client(folders.credentials)
            for uri in folders.uris:
                folder = Location.parse(uri)
                delete_folder(s3, folder.root, folder.path)
        except (ClientError, BotoCoreError) as exc:
            return FoldersFailed(str(exc))
        return FoldersDeleted(folders.uris)


def delete_folder(s3: Any, bucket: str, key_prefix: str) -> None:
    """Every object under the folder, its provenance record last (a half-deleted folder stays recognisable)."""
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key_prefix}/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    record = f"{key_prefix}/{PROVENANCE}"
    rest = [k for k in keys if k != record]
    for i in range(0, len(rest), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in rest[i : i + 1000]]})
    s3.delete_object(Bucket=bucket, Key=record)
