"""Leader election for `speculator-operator run --leader-elect`: replicas wait on a coordination.k8s.io Lease
and only its holder starts kopf. kopf's own peering is no election (it pauses every operator of equal
priority), so the operator runs --standalone and the Lease decides. The rules are runtime/election.py's;
this module reads and writes the Lease, renews it from a thread while kopf runs, stops kopf when the Lease
is lost, and hands it back on a clean shutdown so that a standby takes over at once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from speculator_operator.runtime import election as leader
from speculator_operator.runtime.election import Action, Record, Seen
from speculator_operator.runtime.peers import LEASE_LABEL, SCOPE_ANNOTATION

log = logging.getLogger("speculator_operator.leader")

# client-go's defaults: a standby takes over at most LEASE_SECONDS after the holder stopped renewing; the
# holder gives up (stops its controllers) when it could not renew for RENEW_DEADLINE_SECONDS
LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_SECONDS = 2.0


def _micro(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: client.V1Lease) -> Record:
    spec = lease.spec or client.V1LeaseSpec()
    return Record(
        holder=spec.holder_identity or "",
        duration_s=spec.lease_duration_seconds or LEASE_SECONDS,
        acquired=spec.acquire_time,
        renewed=spec.renew_time,
        transitions=spec.lease_transitions or 0,
    )


def _spec(record: Record) -> dict[str, Any]:
    return {
        "holderIdentity": record.holder or None,
        "leaseDurationSeconds": record.duration_s,
        "acquireTime": _micro(record.acquired) if record.acquired else None,
        "renewTime": _micro(record.renewed) if record.renewed else None,
        "leaseTransitions": record.transitions,
    }


class Elector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        duration_s: int = LEASE_SECONDS,
        scope: str | None = None,
    ) -> None:
        """`scope`: what this operator watches (peers.scope_text), written on the Lease with the label that lets
        other releases' operators find it (runtime/peers.py); None writes neither."""
        self.leases = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity, self.duration_s = namespace, name, identity, duration_s
        self.scope = scope
        self.seen: Seen | None = None
        self.renewed_at = 0.0  # monotonic time of our last successful write

    def _body(self, record: Record, read: client.V1Lease | None) -> Any:
        """The Lease to write; a replace carries the version read, so that of two writers one gets 409."""
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.scope is not None:
            meta["labels"] = {LEASE_LABEL: "true"}
            meta["annotations"] = {SCOPE_ANNOTATION: self.scope}
        if read is not None and read.metadata is not None:
            meta["resourceVersion"] = read.metadata.resource_version
        # a dict, not a V1Lease: the client would write its datetimes without the microseconds a MicroTime needs
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": _spec(record)}

    def _read(self) -> client.V1Lease | None:
        try:
            return self.leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def lease(self) -> client.V1Lease | None:
        """The Lease as the API server holds it now."""
        return self._read()

    def try_once(self) -> bool:
        """One round: read, decide, write. True when we hold the Lease after it."""
        lease = self._read()
        current = _record(lease) if lease is not None else None
        now = time.monotonic()
        decision = leader.decide(current, self.seen, self.identity, self.duration_s, now, datetime.now(UTC))
        self.seen = decision.seen
        if decision.action is Action.WAIT or decision.write is None:
            return False
        try:
            if lease is None:
                self.leases.create_namespaced_lease(self.namespace, self._body(decision.write, None))
            else:
                body = self._body(decision.write, lease)
                self.leases.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first: its record is the one to watch now
                return False
            raise
        if decision.action is not Action.RENEW:
            log.info(
                "Lease %s/%s acquired by %s (%s, transition %d)",
                self.namespace,
                self.name,
                self.identity,
                "created" if decision.action is Action.CREATE else f"was {current.holder if current else ''!r}",
                decision.write.transitions,
            )
        self.renewed_at = now
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Blocks until the Lease is ours (True) or `stop` is set (False). API errors are retried: a standby
        outlives an API server restart."""
        waiting_logged = False
        while not stop.is_set():
            try:
                if self.try_once():
                    return True
            except (ApiException, OSError) as exc:
                log.warning("Lease %s/%s: cannot read or write it: %s", self.namespace, self.name, _reason(exc))
            if not waiting_logged and self.seen is not None and self.seen.record is not None:
                log.info("standby: Lease %s/%s is held by %s", self.namespace, self.name, self.seen.record.holder)
                waiting_logged = True
            stop.wait(RETRY_SECONDS)
        return False

    def keep(self, lost: Callable[[], None], done: threading.Event) -> threading.Thread:
        """Renews the Lease every RETRY_SECONDS from a thread until `done`; calls `lost` once when it could
        not renew for RENEW_DEADLINE_SECONDS or another holder took it."""

        def loop() -> None:
            while not done.wait(RETRY_SECONDS):
                try:
                    held = self.try_once()
                except (ApiException, OSError) as exc:
                    log.warning("Lease %s/%s: renewal failed: %s", self.namespace, self.name, _reason(exc))
                    held = time.monotonic() - self.renewed_at < RENEW_DEADLINE_SECONDS
                if not held:
                    holder = self.seen.record.holder if self.seen and self.seen.record else ""
                    log.error(
                        "Lease %s/%s lost (now held by %r): stopping the controllers",
                        self.namespace,
                        self.name,
                        holder,
                    )
                    lost()
                    return

        thread = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Hands the Lease back, if still ours: a standby takes it on its next try instead of waiting out
        the lease duration."""
        try:
            lease = self._read()
            if lease is None:
                return
            record = leader.released(_record(lease), self.identity, datetime.now(UTC))
            if record is None:
                return
            self.leases.replace_namespaced_lease(self.name, self.namespace, self._body(record, lease))
            log.info("Lease %s/%s released by %s", self.namespace, self.name, self.identity)
        except (ApiException, OSError) as exc:
            log.warning(
                "Lease %s/%s: not released (%s): the next holder waits out its duration",
                self.namespace,
                self.name,
                _reason(exc),
            )


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__


class StandbyHealth:
    """The liveness endpoint while kopf (which serves it once running) has not started: a standby is alive."""

    def __init__(self, url: str | None) -> None:
        self.server: ThreadingHTTPServer | None = None
        if not url:
            return
        parsed = urlparse(url)
        path = parsed.path or "/"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code = 200 if self.path.split("?")[0] == path else 404
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b'{"standby": true}' if code == 200 else b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        # the address kopf's endpoint will take (in a pod: every address, for the kubelet's probe)
        self.server = ThreadingHTTPServer((parsed.hostname or "", parsed.port or 80), Handler)
        threading.Thread(target=self.server.serve_forever, name="standby-health", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
