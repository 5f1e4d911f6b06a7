"""The capture's counters, in prometheus_client's default registry of the process the middleware runs in: vLLM's API
server, whose /metrics serves that registry (vllm/v1/metrics/prometheus.py `get_prometheus_registry`). With
--api-server-count above 1 vLLM sets PROMETHEUS_MULTIPROC_DIR before it starts the API server processes, so the
counters each one makes here are files in that folder and /metrics sums them (prometheus_client's
MultiProcessCollector); the spool gauge sums the live processes' values. The names are the pod contract's
(api/podcontract.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from speculator_operator.api.podcontract import (
    CAPTURE_BYTES_METRIC,
    CAPTURE_ERRORS_METRIC,
    CAPTURE_EXPIRED_METRIC,
    CAPTURE_REQUESTS_METRIC,
    CAPTURE_SKIPPED_METRIC,
    CAPTURE_SPOOL_ROWS_METRIC,
)

REQUESTS = Counter(
    CAPTURE_REQUESTS_METRIC,
    "Sampled requests by what became of them: captured (written to storage), skipped (not eligible), dropped "
    "(the spool was full, or storage failed).",
    ["outcome"],
)
SKIPPED = Counter(CAPTURE_SKIPPED_METRIC, "Sampled requests not captured, by reason.", ["reason"])
BYTES = Counter(CAPTURE_BYTES_METRIC, "Shard bytes written to storage.")
SPOOL_ROWS = Gauge(CAPTURE_SPOOL_ROWS_METRIC, "Captured rows waiting in the spool.", multiprocess_mode="livesum")
ERRORS = Counter(
    CAPTURE_ERRORS_METRIC,
    "Capture errors, by kind: config (settings unreadable: capture off), capture (a response the capture could not "
    "read, forwarded as the server sent it), storage (a shard not written), retention (expired shards not listed "
    "or not deleted).",
    ["kind"],
)
EXPIRED = Counter(CAPTURE_EXPIRED_METRIC, "Shards deleted because they were older than storage.retentionDays.")


def skipped(reason: str) -> None:
    SKIPPED.labels(reason).inc()
    REQUESTS.labels("skipped").inc()


def dropped(rows: int = 1) -> None:
    REQUESTS.labels("dropped").inc(rows)
