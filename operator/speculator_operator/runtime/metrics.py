"""The operator's own metrics about its work (served on SPECULATOR_METRICS_PORT with the acceptance gauges
of telemetry.py): reconciles by kind and outcome and their durations, audits by outcome and findings by
rule, train-job stage durations by stage and outcome."""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import kopf
import prometheus_client
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from speculator_operator.domain.checkpoint import AuditReport
from speculator_operator.runtime.allocator import heap_in_use

RECONCILES = Counter("speculator_reconciles", "Reconciles by kind and outcome (ok, retry, error)", ("kind", "outcome"))
RECONCILE_SECONDS = Histogram(
    "speculator_reconcile_duration_seconds",
    "Reconcile durations by kind and outcome",
    ("kind", "outcome"),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PASSES = Counter(
    "speculator_passes",
    "Passes of the work queue (one per object at a time; each writes status at most once), by kind and outcome "
    "(ok, retry, error)",
    ("kind", "outcome"),
)
AUDITS = Counter("speculator_audits", "Checkpoint audits by kind and outcome (passed, failed)", ("kind", "outcome"))
CANARY_VERDICTS = Counter(
    "speculator_canary_verdicts",
    "Canary verdicts by SpeculatorDeployment and verdict (Promoted, RolledBack)",
    ("namespace", "name", "verdict"),
)
FINDINGS = Counter("speculator_audit_findings", "Audit findings by rule and severity", ("rule", "severity"))
STATUS_WRITES = Counter(
    "speculator_status_writes",
    "Status patches stored, by kind and cause (reconcile, child, scrape, poll, resync, retrain, tuning, retention, "
    "progress)",
    ("kind", "cause"),
)
LANE_WAIT = Histogram(
    "speculator_lane_wait_seconds",
    "How long work waited for a thread of its pool (child events, periodic jobs, reconciles)",
    ("lane",),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
PASS_SECONDS = Histogram(
    "speculator_pass_duration_seconds",
    "How long one pass of the work queue took, from its start to its end, by kind and lane (quick: only causes "
    "that need no audit or checkpoint read; slow: the others)",
    ("kind", "lane"),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
LOOP_LAG = Histogram(
    "speculator_event_loop_lag_seconds",
    "How late the operator's event loop (kopf's watches and handlers, the periodic jobs) woke from a timed "
    "sleep: every trigger waits this long before it is even enqueued",
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)
STAGE_SECONDS = Histogram(
    "speculator_trainjob_stage_duration_seconds",
    "Train-job stage durations (the stage Job's start to its end) by stage and outcome",
    ("stage", "outcome"),
    buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 48 * 3600),
)


_tables: dict[str, Callable[[], int]] = {}


def tracked(table: str, size: Callable[[], int]) -> None:
    """Report the size of one of the process's per-object tables (`size()` is read at each scrape) as
    speculator_operator_tracked_objects{table}: every entry of one is dropped when its object is deleted,
    so after a burst of creates and deletes each table is back to what it was (a test and an alert can
    tell a leak of per-object state from the allocator's fragmentation, which the resident set mixes in)."""
    _tables[table] = size


class _Tracked:
    """speculator_operator_tracked_objects, and the live heap: Python's blocks and the C heap's bytes."""

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # registered without a collect at import time

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "speculator_operator_tracked_objects", "Entries of the operator's per-object tables", labels=["table"]
        )
        for table, size in sorted(_tables.items()):
            family.add_metric([table], size())
        yield family
        # what is live, not what stays resident: a leak raises these, the allocators' fragmentation does not.
        # Garbage that waits for the collector is not live: a full collection comes first (47 ms for 311k
        # tracked objects on the 2-core machine; the operator tracked 127k after a burst of 100). Without it
        # the reading moved by whatever had died since Python's last full pass, which it runs only once a
        # quarter more objects have survived into its oldest generation: the same operator, every object of
        # a burst deleted, read 536k blocks once and 634k the next time.
        gc.collect()
        yield GaugeMetricFamily(
            "speculator_operator_python_blocks",
            "Blocks Python's allocator has handed out to live objects (read after a full garbage collection)",
            sys.getallocatedblocks(),
        )
        c_heap = heap_in_use()
        if c_heap is not None:
            yield GaugeMetricFamily(
                "speculator_operator_c_heap_in_use_bytes", "Bytes the C heap has handed out (glibc mallinfo2)", c_heap
            )


prometheus_client.REGISTRY.register(_Tracked())
LEADER = Gauge("speculator_operator_leader", "1 while this replica runs the controllers, 0 while it stands by")
_serving = threading.Lock()
_served = False


def serve(port: int | None, address: str | None = None) -> None:
    """Serve /metrics on `port` (SPECULATOR_METRICS_PORT; None: not served) and `address`
    (SPECULATOR_METRICS_ADDRESS; None: every address, in a pod its own), once per process: a standby serves it
    too, so that every replica behind the metrics Service answers its scrape."""
    global _served
    with _serving:
        if _served or not port:
            return
        if address:
            prometheus_client.start_http_server(port, addr=address)
        else:
            prometheus_client.start_http_server(port)
        _served = True


@contextmanager
def reconciling(kind: str) -> Iterator[None]:
    """Count and time one reconcile: ok, retry (kopf.TemporaryError: waiting for an input) or error."""
    start = time.perf_counter()
    outcome = "ok"
    try:
        yield
    except kopf.TemporaryError:
        outcome = "retry"
        raise
    except Exception:
        outcome = "error"
        raise
    finally:
        RECONCILES.labels(kind, outcome).inc()
        RECONCILE_SECONDS.labels(kind, outcome).observe(time.perf_counter() - start)


def audited(kind: str, report: AuditReport) -> None:
    AUDITS.labels(kind, "passed" if report.ok else "failed").inc()
    for finding in report.findings:
        FINDINGS.labels(finding.rule, str(finding.severity)).inc()


def _seconds(row: dict[str, Any]) -> float | None:
    try:
        start = datetime.fromisoformat(str(row["startTime"]).replace("Z", "+00:00"))
        end = datetime.fromisoformat(str(row["completionTime"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return max(0.0, (end - start).total_seconds())


def finished_stages(old: list[dict[str, Any]] | None, new: list[dict[str, Any]] | None) -> list[tuple[str, str, float]]:
    """(stage, outcome, seconds) of the stages that finished between two `status.stages` lists."""
    before = {row.get("name"): row.get("phase") for row in old or []}
    out = []
    for row in new or []:
        phase = row.get("phase")
        if phase in ("Succeeded", "Failed") and before.get(row.get("name")) != phase:
            seconds = _seconds(row)
            if seconds is not None:
                out.append((str(row.get("name")), phase.lower(), seconds))
    return out


def stages_finished(old: list[dict[str, Any]] | None, new: list[dict[str, Any]] | None) -> None:
    """Observe the stages that finished in this pass; the audit stage's end is a train job's audit."""
    for stage, outcome, seconds in finished_stages(old, new):
        STAGE_SECONDS.labels(stage, outcome).observe(seconds)
        if stage == "audit":
            AUDITS.labels("SpeculatorTrainJob", "passed" if outcome == "succeeded" else "failed").inc()


def canary_verdict(namespace: str, name: str, verdict: str) -> None:
    CANARY_VERDICTS.labels(namespace, name, verdict).inc()
