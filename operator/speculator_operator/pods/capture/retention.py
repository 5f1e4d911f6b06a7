"""Retention by age, done where the shards are written: each capture process, at start and every CHECK_SECONDS,
deletes its deployment's shards older than storage.retentionDays (docs/concepts/learning.md#retention).

The pod does it because only the pod reaches a pvc:// claim, and it holds the location's credentials. A shard's age
is the time at the head of its name (its first row's); a key that does not parse as a shard's is never touched.
Every process of every pod sweeps the same folder: a delete of a shard already gone is no error, and a listing or a
delete that fails is counted and said once, and tried again at the next sweep. No learning run reads shards yet, so
no snapshot has to be spared; the loop that starts runs brings that rule with it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from speculator_operator.api.podcontract import CaptureSettings
from speculator_operator.pods.capture import metrics
from speculator_operator.pods.capture.spool import ShardKey, Writer, shard_folder, writer_for

log = logging.getLogger(__name__)
CHECK_SECONDS = 3600.0
FIRST_SECONDS = 60.0  # after the server starts: its first requests come first
SHARD_TIME = "%Y%m%dT%H%M%SZ"


def shard_time(key: str) -> datetime | None:
    """When a shard's first row was captured, from its name (None: not a shard's name). A pvc:// shard's hidden
    temporary (`.NAME.tmp`, left by a pod stopped while writing it) is a shard's too."""
    name = key.rsplit("/", 1)[-1]
    if name.startswith(".") and name.endswith(".jsonl.tmp"):
        name = name[1:].removesuffix(".tmp")
    if not name.endswith(".jsonl"):
        return None
    try:
        return datetime.strptime(name[:16], SHARD_TIME).replace(tzinfo=UTC)
    except ValueError:
        return None


def sweep(writer: Writer, folder: str, now: datetime, days: int) -> tuple[int, Exception | None]:
    """Delete the shards under `folder` older than `days` days at `now`: how many went, and the first error met.
    A shard that cannot be deleted (an object lock, a key's own deny) does not keep the others."""
    cutoff = now - timedelta(days=days)
    expired = [k for k in writer.keys(folder) if (at := shard_time(k)) is not None and at < cutoff]
    gone, error = 0, None
    for key in expired:
        try:
            writer.delete(key)
        except Exception as exc:
            error = error or exc
            continue
        gone += 1
    return gone, error


class Retention:
    """The sweeping thread of one capture process."""

    def __init__(
        self,
        settings: Callable[[], CaptureSettings | None],
        *,
        writers: Callable[[ShardKey], tuple[Writer, str]] = writer_for,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        every: float = CHECK_SECONDS,
        first: float = FIRST_SECONDS,
    ) -> None:
        self.settings, self.writers, self.wall = settings, writers, wall
        self.every, self.first = every, first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="speculator-capture-retention", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        wait = self.first
        while not self._stop.wait(wait):
            self.once()
            wait = self.every

    def once(self) -> int:
        """One sweep with the settings as they are now (those last read, even while the capture is off: what was
        written still expires). How many shards went."""
        settings = self.settings()
        if settings is None or settings.retention_days is None:
            return 0
        key = ShardKey(settings.location, settings.pvc_mount, settings.namespace, settings.deployment, "", "")
        try:
            writer, prefix = self.writers(key)
            gone, error = sweep(writer, shard_folder(key, prefix), self.wall(), settings.retention_days)
        except Exception as exc:  # the listing
            gone, error = 0, exc
        metrics.EXPIRED.inc(gone)
        if error is not None:
            metrics.ERRORS.labels("retention").inc()
            if not self._failing:  # the error's kind and words (a bucket, a path, a status), never a row
                log.warning("capture: expired shards under %s not deleted: %s: %.300s", settings.location,
                            type(error).__name__, error)  # fmt: skip
            self._failing = True
            return gone
        self._failing = False
        if gone:
            log.info("capture: %d shards older than %d days deleted under %s", gone, settings.retention_days,
                     settings.location)  # fmt: skip
        return gone
