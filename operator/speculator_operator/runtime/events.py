"""The operator's Kubernetes Events, posted through the operator's own Kubernetes client (runtime/kube.py): an
`EventRecorder` is made at start-up and handed to each kind's controller (`Controller.start`), whose passes
post through it.

- What is posted: a core/v1 Event (`/api/v1/namespaces/NS/events`), the API `kubectl describe` and `kubectl get
  events` read (kubectl describe searches core/v1 Events by involvedObject; events.k8s.io/v1 is a second view of the
  same objects, under other field names), the one every reader of this project's events (tests/cluster,
  docs/operations/troubleshooting.md) names, and the one the chart's RBAC grants (`create` on `events` in the core
  group, and nothing else to write them: nothing patches an Event). `involvedObject` is the object's apiVersion,
  kind, namespace, name and uid; `source.component` and `reportingComponent` are "speculator-operator"; the message
  is cut to 1,024 characters (kopf's limit; a core/v1 Event takes more, a describe shows less).
- When: in the background, in order per object, on a few threads of the recorder's own, so that a pass never waits
  on an event (as kopf's poster, which still posts kopf's own warnings). An event that cannot be posted is logged
  and dropped: events are best effort, the status says the same.
- How many: every one, as kopf's poster does; each event is an object of its own (no aggregation into a
  `count`), so that three identical "changed by kubectl; restored" events are three (tests/cluster/
  test_drift.py counts them) and "exactly one event per transition" can be checked by counting. A limit per
  object can be asked for (`burst`): client-go's spam filter (`EventSourceObjectSpamFilter`), a token bucket
  per object, `burst` events at once and one more every `refill_seconds`, kept for the `max_objects` objects
  that posted last (an LRU, as client-go's). The operator asks for none: a dropped event would be a change
  in what it says (a Warning after 25 restorations of one object would go unseen).
- After `close` (the operator stopping), an event is logged and dropped, never queued to a thread that left.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

COMPONENT = "speculator-operator"
MAX_MESSAGE = 1024
BURST = 25  # client-go's defaultSpamBurst, when a limit is asked for
REFILL_SECONDS = 300.0  # one token per this many seconds: client-go's defaultSpamQPS, 1/300
MAX_OBJECTS = 4096  # client-go's maxLruCacheEntries
POSTERS = 4  # threads posting; an object's events always go to the same one
log = logging.getLogger(__name__)

Create = Callable[[str, dict[str, Any]], None]  # (namespace, Event body) -> posted, or raises


def create_event(namespace: str, body: dict[str, Any]) -> None:
    """POST a core/v1 Event with the operator's client (the dynamic client, as every other call: kube.py)."""
    from speculator_operator.runtime import kube

    kube.resource_for("v1", "Event").create(body=body, namespace=namespace, serialize=False)


def reference(obj: Mapping[str, Any]) -> dict[str, str]:
    """The involvedObject of an event about `obj` (a body as the API server returns it)."""
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": str(obj.get("apiVersion") or ""),
        "kind": str(obj.get("kind") or ""),
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
    }
    return {k: v for k, v in ref.items() if v}


def body(ref: Mapping[str, str], type_: str, reason: str, message: str, instance: str, at: datetime) -> dict[str, Any]:
    """A core/v1 Event about the object `ref` names, as the recorder posts it: as client-go's core/v1 recorder
    makes one (first and last timestamps, a count, no `eventTime`: an Event with one must also name an `action`,
    a field of events.k8s.io's that nothing here has)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.get('name') or 'object'}.", "namespace": ref.get("namespace")},
        "involvedObject": dict(ref),
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


@dataclass
class _Bucket:
    tokens: float
    at: float


class EventRecorder:
    """Posts Events about objects (`event`), in the background. `create(namespace, body)` posts one (default: the
    operator's client); `clock` is monotonic seconds, for the rate limit."""

    def __init__(
        self,
        create: Create = create_event,
        *,
        instance: str | None = None,
        burst: int | None = None,
        refill_seconds: float = REFILL_SECONDS,
        max_objects: int = MAX_OBJECTS,
        posters: int = POSTERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._create, self._clock = create, clock
        self._instance = instance or os.environ.get("POD_NAME") or socket.gethostname()
        self._burst = None if burst is None else float(burst)
        self._refill, self._max = refill_seconds, max_objects
        self._closed = False
        self._buckets: OrderedDict[tuple[str, ...], _Bucket] = OrderedDict()
        self._lock = threading.Condition()
        self._unposted = 0  # handed over, not yet posted or given up
        self._queues: list[queue.Queue[tuple[str, dict[str, Any]] | None]] = [queue.Queue() for _ in range(posters)]
        self._threads = [
            threading.Thread(target=self._post, args=(q,), name=f"events-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()
        self.dropped = 0  # events the rate limit dropped

    def event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        """Post an Event about `obj` (`type` Normal or Warning), unless its object posted too many of late."""
        ref = reference(obj)
        key = (ref.get("namespace", ""), ref.get("kind", ""), ref.get("name", ""), ref.get("uid", ""))
        if self._closed:
            log.info("%s/%s: event %s not posted (the operator is stopping): %s", key[0], key[2], reason,
                     message[:200])  # fmt: skip
            return
        if not self._allowed(key):
            log.info("%s/%s: event %s not posted (more than %d of late): %s", key[0], key[2], reason,
                     int(self._burst or 0), message[:200])  # fmt: skip
            return
        event = body(ref, type, reason, message, self._instance, datetime.now(UTC))
        self._queues[zlib.crc32(repr(key).encode()) % len(self._queues)].put((ref.get("namespace", ""), event))

    def _allowed(self, key: tuple[str, ...]) -> bool:
        if self._burst is None:
            with self._lock:
                self._unposted += 1
            return True
        now = self._clock()
        with self._lock:
            bucket = self._buckets.pop(key, None) or _Bucket(self._burst, now)
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) / self._refill)
            bucket.at = now
            allowed = bucket.tokens >= 1.0
            if allowed:
                bucket.tokens -= 1.0
                self._unposted += 1
            else:
                self.dropped += 1
            self._buckets[key] = bucket  # the most recent last
            while len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
            return allowed

    def objects(self) -> int:
        """How many objects' buckets are kept (at most `max_objects`)."""
        with self._lock:
            return len(self._buckets)

    def _post(self, backlog: queue.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        while (item := backlog.get()) is not None:
            namespace, event = item
            try:
                self._create(namespace, event)
            except Exception as exc:  # best effort, as kopf's: the status says the same
                why = str(getattr(exc, "body", None) or exc)[:300]  # an ApiException: the API server's own words
                name = event["involvedObject"].get("name")
                log.warning("event %s about %s/%s not posted: %s", event["reason"], namespace, name, why)
            finally:
                with self._lock:
                    self._unposted -= 1
                    self._lock.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event handed over so far was posted or given up (False: timed out)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._unposted == 0, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued (for at most `timeout` s), then stop the threads; later events are dropped."""
        self._closed = True
        for backlog in self._queues:
            backlog.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class Discarding(EventRecorder):
    """The recorder of a controller that was not started (a pass run by a test, outside the operator): what it is
    given is logged, not posted."""

    def __init__(self) -> None:
        # it posts nothing, so it names no instance (and reads no POD_NAME: one is made when a module is imported)
        super().__init__(lambda namespace, body: None, posters=0, instance="not-started")

    def event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        log.debug("%s/%s: event %s %s (not posted): %s", meta.get("namespace"), meta.get("name"), type, reason,
                  message[:200])  # fmt: skip
