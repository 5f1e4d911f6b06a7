"""The capture's spool: a queue bounded in bytes and in rows that one background thread drains into shards, so that a
response never waits on storage. A row that does not fit is dropped and counted; so is every row of a shard that
storage refused (then the thread backs off, and the queue, still bounded, fills and drops meanwhile).

Shards are jsonl, one row a line, written whole: `s3://` with one put_object through boto3 (the pod's AWS_*
environment, AWS_ENDPOINT_URL included, as the operator's own client reads it), `pvc://` under the claim's mount
as a hidden temporary name renamed into place, so a reader never sees half a shard. A shard is written at
SHARD_ROWS rows or SHARD_SECONDS after its first row, whichever comes first, and when the server stops."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from speculator_operator.api.podcontract import CAPTURE_CREDENTIALS_ENV, CAPTURE_POD_ENV, CAPTURE_PVC_MOUNT
from speculator_operator.domain.location import Location
from speculator_operator.pods.capture import metrics

log = logging.getLogger(__name__)

SPOOL_BYTES = 64 * 2**20  # rows waiting, and rows being gathered from responses still streaming
SPOOL_ROWS = 10_000
SHARD_ROWS = 1000
SHARD_SECONDS = 60.0
BACKOFF_SECONDS = (1.0, 60.0)  # the first wait after a failed write, doubled per failure up to the second


@dataclass(frozen=True)
class ShardKey:
    """What a shard's rows share, and so its name: where it goes, and whose pair's traffic it holds."""

    location: str
    pvc_mount: str
    namespace: str
    deployment: str
    verifier_revision: str
    draft_revision: str


class Writer(Protocol):
    def write(self, key: str, body: bytes) -> None:
        """Store `body` at `key` (a path relative to the location's root), whole, or raise."""

    def keys(self, prefix: str) -> Iterator[str]:
        """The keys under `prefix/` (relative to the location's root), for retention."""

    def delete(self, key: str) -> None:
        """Delete `key`; one already gone is no error."""


def mounted_credentials(directory: str | None) -> dict[str, str]:
    """The AWS_* keys of a mounted Secret (storage.credentials), one file each, read as they are now: the kubelet
    swaps a rotated Secret's files in place. Empty with no directory, or a Secret not there (optional in the pod)."""
    from speculator_operator.adapters.sources import S3_KEYS  # boto3 only once a shard is written

    found: dict[str, str] = {}
    if not directory:
        return found
    root = Path(directory)
    for name in S3_KEYS:
        try:
            value = (root / name).read_text().strip()
        except OSError:
            continue
        if value:
            found[name] = value
    return found


def secret_client(found: dict[str, str]) -> Any:
    """An S3 client from storage.credentials' keys alone: the serving container's own AWS_* (its model's
    credentials, perhaps another endpoint) must not fill in what the Secret lacks, so neither the environment's
    keys nor its endpoint are read; without a key pair nothing is written."""
    import boto3
    from botocore.config import Config

    from speculator_operator.adapters.sources import botocore_session

    if not (found.get("AWS_ACCESS_KEY_ID") and found.get("AWS_SECRET_ACCESS_KEY")):
        raise OSError("storage.credentials holds no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return boto3.session.Session(botocore_session=botocore_session()).client(
        "s3",
        endpoint_url=found.get("AWS_ENDPOINT_URL_S3") or found.get("AWS_ENDPOINT_URL") or None,
        aws_access_key_id=found["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=found["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=found.get("AWS_SESSION_TOKEN") or None,
        region_name=found.get("AWS_DEFAULT_REGION") or found.get("AWS_REGION") or None,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, ignore_configured_endpoint_urls=True),
    )


class S3Writer:
    """Writes with storage.credentials' mounted keys where the pod names them (SPECULATOR_CAPTURE_CREDENTIALS),
    read again at each use so that a rotation applies; else with the pod's default chain (no Secret given)."""

    def __init__(self, bucket: str, client: Any = None, credentials: str | None = None) -> None:
        self.bucket = bucket
        self.client = client
        self.credentials = credentials if credentials is not None else os.environ.get(CAPTURE_CREDENTIALS_ENV)
        self._made: tuple[tuple[tuple[str, str], ...], Any] | None = None

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        if not self.credentials:
            from speculator_operator.adapters.sources import s3_client

            return s3_client()
        found = mounted_credentials(self.credentials)
        keys = tuple(sorted(found.items()))
        if self._made is None or self._made[0] != keys:  # one client per set of keys: a rotation makes a new one
            self._made = (keys, secret_client(found))
        return self._made[1]

    def write(self, key: str, body: bytes) -> None:
        self._client().put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/x-ndjson")

    def keys(self, prefix: str) -> Iterator[str]:
        pages = self._client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{prefix}/")
        for page in pages:
            for item in page.get("Contents") or []:
                yield item["Key"]

    def delete(self, key: str) -> None:
        self._client().delete_object(Bucket=self.bucket, Key=key)  # S3 answers 204 for a key already gone


class PvcWriter:
    def __init__(self, root: Path, mounted: bool = False) -> None:
        self.root = root
        self.mounted = mounted  # the root must be a mount point

    def write(self, key: str, body: bytes) -> None:
        path = self._check(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.parent / f".{path.name}.tmp"  # neither a .jsonl nor visible: prepare-data never reads it
        with open(temporary, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)

    def keys(self, prefix: str) -> Iterator[str]:
        base = self._check(prefix)
        for folder, _, files in os.walk(base):
            for name in files:
                yield str((Path(folder) / name).relative_to(self.root))

    def delete(self, key: str) -> None:
        self._check(key).unlink(missing_ok=True)

    def _check(self, key: str) -> Path:
        """`key`'s path, under the root (else OSError): the pod's own disk is no place for user data."""
        if self.mounted and not os.path.ismount(self.root):  # the claim was not there when the pod was made
            raise OSError(f"{self.root} is not a mounted volume")
        path = self.root / key
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise OSError(f"{key!r} is not under {self.root}")
        return path


def writer_for(key: ShardKey) -> tuple[Writer, str]:
    """The writer of a shard key's location, and the key prefix under its root."""
    where = Location.parse(key.location)
    if where.is_s3:
        return S3Writer(where.root), where.path.strip("/")
    if where.is_pvc:
        # the pod's claim mount must be one; another root (a test's, a host path) is taken as it is
        return PvcWriter(Path(key.pvc_mount), mounted=key.pvc_mount == CAPTURE_PVC_MOUNT), where.path.strip("/")
    raise ValueError(f"not a capture location: {where.scheme}")


def _segment(value: str) -> str:
    return value.replace("/", "_") or "_"


def shard_name(key: ShardKey, prefix: str, opened: datetime, pod: str, seq: str) -> str:
    """`{prefix}/{namespace}/{deployment}/{verifierRevision}/{draftRevision}/{YYYYMMDDTHHMMSSZ}-{pod}-{seq}.jsonl`, the
    time being the shard's first row's."""
    parts = [shard_folder(key, prefix), *(_segment(p) for p in (key.verifier_revision, key.draft_revision))]
    return "/".join([*parts, f"{opened.astimezone(UTC):%Y%m%dT%H%M%SZ}-{_segment(pod)}-{seq}.jsonl"])


def shard_folder(key: ShardKey, prefix: str) -> str:
    """`{prefix}/{namespace}/{deployment}`: every shard of one deployment, whatever its pair."""
    parts = [prefix] if prefix else []
    return "/".join([*parts, *(_segment(p) for p in (key.namespace, key.deployment))])


def pod_name() -> str:
    return os.environ.get(CAPTURE_POD_ENV) or os.environ.get("HOSTNAME") or socket.gethostname()


class Spool:
    def __init__(
        self,
        *,
        max_bytes: int = SPOOL_BYTES,
        max_rows: int = SPOOL_ROWS,
        shard_rows: int = SHARD_ROWS,
        shard_seconds: float = SHARD_SECONDS,
        writers: Callable[[ShardKey], tuple[Writer, str]] = writer_for,
        pod: str | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        backoff: tuple[float, float] = BACKOFF_SECONDS,
    ) -> None:
        self.max_bytes, self.max_rows = max_bytes, max_rows
        self.shard_rows, self.shard_seconds = shard_rows, shard_seconds
        self.writers = writers
        self.pod = pod or pod_name()
        self.wall = wall
        self.backoff = backoff
        # one process of the pod's API servers names its shards apart from the others' with its id
        self._seq = (f"{os.getpid()}-{n:06d}" for n in itertools.count())
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: deque[tuple[ShardKey, bytes]] = deque()
        self._bytes = 0  # queued, in the open shard, and reserved by rows being gathered
        self._rows = 0  # queued and in the open shard
        self._flushes = 0  # flushes asked for
        self._flushed = 0  # flushes done
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._writers: dict[ShardKey, tuple[Writer, str]] = {}
        self._failing = False
        self._wait = 0.0  # the last back-off

    # ---- the request path: never blocks on storage, only on this lock -------------------------------------

    def reserve(self, size: int) -> bool:
        """Hold `size` bytes of the bound for a row being gathered (False: no room, the row is dropped)."""
        with self._lock:
            if self._bytes + size > self.max_bytes:
                return False
            self._bytes += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._bytes -= size

    def put(self, key: ShardKey, line: bytes, reserved: int = 0) -> bool:
        """Queue one row (its reservation given back); False when it does not fit: the caller counts it dropped."""
        with self._lock:
            self._bytes -= reserved
            if self._bytes + len(line) > self.max_bytes or self._rows + 1 > self.max_rows:
                return False
            self._bytes += len(line)
            self._rows += 1
            self._queue.append((key, line))
            metrics.SPOOL_ROWS.set(self._rows)
            self._start()
            self._changed.notify()
        return True

    def tune(self, shard_rows: int | None, shard_seconds: float | None) -> None:
        """When shards are written from now on (None: as before)."""
        with self._lock:
            self.shard_rows = shard_rows or self.shard_rows
            self.shard_seconds = shard_seconds or self.shard_seconds
            self._changed.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="speculator-capture-spool", daemon=True)
            self._thread.start()

    # ---- control -----------------------------------------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Write every row queued now (tests, and the server's stop); True when done within `timeout`."""
        with self._lock:
            if self._thread is None:
                return True
            self._flushes += 1
            wanted = self._flushes
            self._changed.notify()
            return self._changed.wait_for(lambda: self._flushed >= wanted, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and stop the thread."""
        self.flush(timeout)
        self._stopping.set()
        with self._lock:
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def rows(self) -> int:
        with self._lock:
            return self._rows

    # ---- the writer thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        open_key: ShardKey | None = None
        lines: list[bytes] = []
        opened_at = 0.0
        opened: datetime | None = None
        while True:
            with self._lock:
                while not (self._queue or self._stopping.is_set() or self._flushes > self._flushed):
                    if lines and time.monotonic() - opened_at >= self.shard_seconds:
                        break
                    self._changed.wait(max(0.0, self.shard_seconds - (time.monotonic() - opened_at)) if lines else None)
                batch = list(self._queue)
                self._queue.clear()
                flushing = self._flushes
            for key, line in batch:
                if open_key is not None and key != open_key:
                    self._write(open_key, opened, lines)
                    lines = []
                if not lines:
                    open_key, opened_at, opened = key, time.monotonic(), self.wall()
                lines.append(line)
                if len(lines) >= self.shard_rows:
                    self._write(key, opened, lines)
                    lines = []
            due = lines and time.monotonic() - opened_at >= self.shard_seconds
            if lines and (due or flushing > self._flushed or self._stopping.is_set()):
                assert open_key is not None
                self._write(open_key, opened, lines)
                lines = []
            with self._lock:
                self._flushed = flushing
                self._changed.notify_all()
            if self._stopping.is_set():
                return

    def _write(self, key: ShardKey, opened: datetime | None, lines: list[bytes]) -> None:
        body = b"".join(lines)
        try:
            if key not in self._writers:
                self._writers[key] = self.writers(key)
            writer, prefix = self._writers[key]
            writer.write(shard_name(key, prefix, opened or self.wall(), self.pod, next(self._seq)), body)
        except Exception as exc:  # any storage failure drops this shard, never the thread
            metrics.ERRORS.labels("storage").inc()
            metrics.dropped(len(lines))
            if not self._failing:
                # the error's kind and words (a bucket, a path, a status), never a row
                log.warning("capture: a shard of %d rows not written to %s: %s: %.300s", len(lines), key.location,
                            type(exc).__name__, exc)  # fmt: skip
            self._failing = True
            self._settle(lines, body)
            self._stopping.wait(self._next_backoff())
            return
        if self._failing:
            log.info("capture: writing to %s again", key.location)
        self._failing = False
        self._wait = 0.0
        metrics.REQUESTS.labels("captured").inc(len(lines))
        metrics.BYTES.inc(len(body))
        self._settle(lines, body)

    def _next_backoff(self) -> float:
        first, most = self.backoff
        self._wait = min(most, self._wait * 2) if self._wait else first
        return self._wait

    def _settle(self, lines: list[bytes], body: bytes) -> None:
        with self._lock:
            self._bytes -= len(body)
            self._rows -= len(lines)
            metrics.SPOOL_ROWS.set(self._rows)
