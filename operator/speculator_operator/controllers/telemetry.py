"""Live acceptance: scrape vLLM's /metrics of every ready serving pod, the way Prometheus does in-cluster,
and write `status.acceptance` and the `SpeculationEffective` condition (decisions: telemetry/acceptance.py,
planning/judgement.py).

It runs beside the reconciles, never in their way: a periodic job per SpeculatorDeployment on the operator's
loop (runtime/scheduler.py; not in the thread pool the reconciles use), targets from an in-memory index of
the serving pods (no API read per scrape), at most SCRAPE_CONCURRENCY requests in flight, each bounded in
time and bytes. A status write happens only when the numbers change materially, and at most once per interval.

Settings (environment): SPECULATOR_SCRAPE_INTERVAL_SECONDS (15), SPECULATOR_SCRAPE_TIMEOUT_SECONDS (3),
SPECULATOR_SCRAPE_CONCURRENCY (16), SPECULATOR_SCRAPE_MAX_BYTES (2 MiB), SPECULATOR_SCRAPE_NETWORKS
(comma-separated CIDRs a target address must lie in; unset: any), SPECULATOR_METRICS_PORT (the
operator's own /metrics; unset: not served).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf
from prometheus_client import Counter, Gauge

from speculator_operator.api.common import evolve, stamp, typed_status
from speculator_operator.api.deployment import (
    Acceptance,
    SpeculatorDeploymentSpec,
    SpeculatorDeploymentStatus,
)
from speculator_operator.controllers.queues import DEPLOYMENTS
from speculator_operator.planning import Problem, parse_spec
from speculator_operator.planning.judgement import Judged, judge
from speculator_operator.planning.passes import Cause
from speculator_operator.planning.watched import ready, scrape_target, scraped
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import scheduler as periodic
from speculator_operator.telemetry.acceptance import (
    acceptance_status,
    disabled_condition,
    economics_of,
    effective_condition,
    first_measure_due,
)
from speculator_operator.telemetry.canary import Analysis, Measured, analysis_now
from speculator_operator.telemetry.vllm_metrics import MetricsError, Window, parse_sample

PLURAL = "speculatordeployments"
SCRAPE_INTERVAL = float(os.environ.get("SPECULATOR_SCRAPE_INTERVAL_SECONDS", "15"))
SCRAPE_TIMEOUT = float(os.environ.get("SPECULATOR_SCRAPE_TIMEOUT_SECONDS", "3"))
SCRAPE_CONCURRENCY = int(os.environ.get("SPECULATOR_SCRAPE_CONCURRENCY", "16"))
MAX_BYTES = int(os.environ.get("SPECULATOR_SCRAPE_MAX_BYTES", str(2 * 1024 * 1024)))


LABELS = ("namespace", "name")
RATE = Gauge("speculator_acceptance_rate", "Accepted / drafted tokens over the window", LABELS)
MEAN_LENGTH = Gauge("speculator_mean_accepted_length", "1 + accepted / drafts over the window", LABELS)
ALPHA = Gauge("speculator_acceptance_alpha", "Per-position acceptance α solving E(α, K) = mean length", LABELS)
SPEEDUP = Gauge("speculator_predicted_speedup", "E(α, K) / (1 + n·c) at the served K", LABELS)
BREAK_EVEN = Gauge("speculator_break_even_alpha", "α* for the pair's cost ratio and K", LABELS)
PER_POSITION = Gauge(
    "speculator_acceptance_per_position", "Drafts with positions 0..p accepted / drafts", (*LABELS, "position")
)
DRAFTS = Gauge("speculator_acceptance_drafts", "Verification steps with drafts in the window (counted pods)", LABELS)
RUNNING = Gauge("speculator_requests_running", "vllm:num_requests_running summed over the counted pods", LABELS)
SCRAPES = Counter("speculator_scrapes", "Scrapes of serving pods by outcome", ("outcome",))
_positions: dict[tuple[str, str], set[str]] = {}  # the position labels set per deployment, to remove them

_semaphore: asyncio.Semaphore | None = None
_session: aiohttp.ClientSession | None = None


def _client() -> tuple[asyncio.Semaphore, aiohttp.ClientSession]:
    global _semaphore, _session
    if _semaphore is None:
        _semaphore = asyncio.Semaphore(SCRAPE_CONCURRENCY)
    if _session is None or _session.closed:
        _session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=SCRAPE_CONCURRENCY, force_close=True),
            headers={"Accept": "text/plain;version=0.0.4"},
        )
    return _semaphore, _session


async def close_client() -> None:
    if _session is not None and not _session.closed:
        await _session.close()


async def close_session(**_: Any) -> None:
    await close_client()


async def fetch_metrics(url: str) -> str:
    """GET a /metrics body, bounded in time and size; MetricsError says what went wrong."""
    semaphore, session = _client()
    async with semaphore:
        try:
            timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)
            async with session.get(url, timeout=timeout, allow_redirects=False) as resp:
                if resp.status != 200:
                    SCRAPES.labels("http_error").inc()
                    raise MetricsError("HTTPError", f"GET {url}: HTTP {resp.status}")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > MAX_BYTES:
                        SCRAPES.labels("too_large").inc()
                        raise MetricsError("TooLarge", f"GET {url}: more than {MAX_BYTES} bytes")
        except TimeoutError:
            SCRAPES.labels("timeout").inc()
            raise MetricsError("Timeout", f"GET {url}: no complete answer within {SCRAPE_TIMEOUT:g} s") from None
        except aiohttp.ClientError as exc:
            SCRAPES.labels("unreachable").inc()
            raise MetricsError("Unreachable", f"GET {url}: {exc.__class__.__name__}: {str(exc)[:200]}") from None
    return body.decode("utf-8", errors="replace")


async def _scrape_one(window: Window, target: dict[str, Any], now: float, also: Window | None = None) -> None:
    """Scrape one pod into `window` (and into `also`, a canary's interval window, when there is one)."""
    pod, revision = str(target["pod"]), target.get("revision")
    ip, port = target.get("ip"), target.get("port")
    windows = [window] if also is None else [window, also]
    if not ip or not port:
        for w in windows:
            w.failed(pod, revision, "NoAddress", "the pod has no address or no http port yet", now)
        return
    if not kube.dialable(str(ip)):
        for w in windows:
            w.failed(pod, revision, "OutsideScrapeNetworks", f"{ip} lies outside SPECULATOR_SCRAPE_NETWORKS", now)
        return
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    try:
        text = await fetch_metrics(f"http://{host}:{port}/metrics")
        sample = parse_sample(text)
    except MetricsError as exc:
        if exc.reason in ("Unparseable", "NoSpecDecodeMetrics"):
            SCRAPES.labels(exc.reason.lower()).inc()
        for w in windows:
            w.failed(pod, revision, exc.reason, str(exc), now)
        return
    SCRAPES.labels("ok").inc()
    for w in windows:
        w.observe(pod, revision, sample, now)


def _publish(namespace: str, name: str, acc: Acceptance) -> None:
    for gauge, key in (
        (RATE, "rate"),
        (MEAN_LENGTH, "mean_accepted_length"),
        (ALPHA, "alpha"),
        (SPEEDUP, "predicted_speedup"),
        (BREAK_EVEN, "break_even_alpha"),
        (DRAFTS, "drafts"),
    ):
        value = getattr(acc, key)
        if isinstance(value, int | float):
            gauge.labels(namespace, name).set(value)
        else:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
    for position, value in enumerate(acc.per_position or []):
        PER_POSITION.labels(namespace, name, str(position)).set(value)
        _positions.setdefault((namespace, name), set()).add(str(position))
    RUNNING.labels(namespace, name).set(float((acc.load.requests_running if acc.load else None) or 0.0))


def forget(namespace: str, name: str) -> None:
    for gauge in (RATE, MEAN_LENGTH, ALPHA, SPEEDUP, BREAK_EVEN, DRAFTS, RUNNING):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for position in _positions.pop((namespace, name), set()):
        with contextlib.suppress(KeyError):
            PER_POSITION.remove(namespace, name, position)


_windows: dict[str, tuple[Window, float]] = {}  # uid -> its acceptance window and when that window began
_ready_since: dict[str, float] = {}  # uid -> since when a serving pod has been ready (monotonic)
_pods: kopf.Index[Any, Any] | None = None
metrics.tracked("telemetry.windows", lambda: len(_windows))
metrics.tracked("telemetry.ready", lambda: len(_ready_since))
metrics.tracked("telemetry.positions", lambda: len(_positions))


def keep_index(**kwargs: Any) -> None:
    """The serving-pod index (controllers/observed.serving_pods: kopf keeps it live from the pod watch, and
    passes it by its name) for the scrape job."""
    global _pods
    _pods = kwargs["serving_pods"]
    _analyses.clear()
    _windows.clear()  # a restart starts every window afresh (the judgement on record stands meanwhile)
    _ready_since.clear()


_analyses: dict[str, Analysis] = {}  # uid -> its canary's interval window, while one is analysed
metrics.tracked("telemetry.analyses", lambda: len(_analyses))


def _analysis(
    uid: str, status: SpeculatorDeploymentStatus, spec: SpeculatorDeploymentSpec, now: float, revisions: set[Any]
) -> Analysis | None:
    """The interval window of this object's canary now (telemetry/canary.py decides), kept per object."""
    at = stamp(datetime.now(UTC))
    found = analysis_now(_analyses.get(uid), status, spec, now, at, revisions, SCRAPE_INTERVAL)
    if found is None:
        _analyses.pop(uid, None)
    else:
        _analyses[uid] = found
    return found


def deployment_gone(namespace: str, name: str, uid: str) -> None:
    """A deleted SpeculatorDeployment's series leave the operator's /metrics (no finalizer needed)."""
    forget(namespace, name)
    _windows.pop(uid, None)
    _ready_since.pop(uid, None)
    _judged.pop((namespace, name), None)
    _analyses.pop(uid, None)


async def scrape_acceptance(body: kopf.Body) -> None:
    spec, status, meta = body.spec, body.status, body.meta
    name, namespace, uid = meta["name"], meta.get("namespace"), meta["uid"]
    current = typed_status(SpeculatorDeploymentStatus, dict(status or {}))
    econ = economics_of(current)
    revision = current.revision
    parsed = parse_spec(SpeculatorDeploymentSpec, spec, current.release)
    if namespace is None or econ is None or not revision or isinstance(parsed, Problem):
        return  # nothing served yet: nothing to measure
    parsed_spec = parsed[0]
    tuning = parsed_spec.serving.tuning
    generation = int(meta.get("generation") or 0)
    acc: Acceptance | None = None
    refilling = False
    measured: Measured | None = None
    if econ.k == 0:  # tuning switched speculation off: nothing to scrape until a probe revision runs
        cond = disabled_condition(generation, current.tuning, current.economics)
    else:
        window, since = _windows.get(uid) or (None, 0.0)
        if window is None or window.seconds != tuning.window_seconds:
            window, since = Window(tuning.window_seconds), time.monotonic()
            _windows[uid] = (window, since)
        refilling = time.monotonic() - since < tuning.window_seconds
        found: Any = _pods.get((namespace, name), []) if _pods is not None else []
        targets = [scrape_target(p) for p in found if ready(p) and scraped(p)]
        now = time.monotonic()
        ready_since = _ready_since.setdefault(uid, now) if targets else _ready_since.pop(uid, None)
        if not first_measure_due(current, bool(targets), ready_since, now, SCRAPE_INTERVAL):
            return  # nothing to say yet (a status write saved per rollout)
        window.keep_only({str(t["pod"]) for t in targets})
        analysis = _analysis(uid, current, parsed_spec, now, {t.get("revision") for t in targets})
        if analysis is not None:
            analysis.window.keep_only({str(t["pod"]) for t in targets})
        also = analysis.window if analysis is not None else None
        await asyncio.gather(*(_scrape_one(window, t, now, also) for t in targets))
        if not periodic.tracking(PLURAL, uid):
            return  # deleted during the scrape: publishing now would bring its series and tables back
        observed_at = stamp(datetime.now(UTC))
        if analysis is not None:
            measured = analysis.measure(parsed_spec, econ, now, observed_at)
        acc = acceptance_status(
            window.totals(revision, now),
            econ,
            revision=revision,
            observed_at=observed_at,
            min_samples=tuning.min_samples,
            adaptive=bool(parsed_spec.serving.adaptive_verification),
        )
        if tuning.mode == "Off":
            acc = evolve(acc, None, recommended_k=None)
        _publish(namespace, name, acc)
        cond = effective_condition(acc, generation, tuning.min_samples)
    pending = _judged.get((namespace, name))
    intervals = (pending.canary if pending is not None else ()) + ((measured,) if measured is not None else ())
    judged = Judged(acc, cond, refilling, intervals)
    new, _, events = judge(parsed_spec, current, judged, generation, now=datetime.now(UTC))
    if new is None and not events and not intervals:
        return  # nothing material: no pass, no write
    if not periodic.tracking(PLURAL, uid):
        return
    # the latest judgement replaces one not yet folded in; a canary's intervals not yet folded in are kept
    _judged[(namespace, name)] = judged
    DEPLOYMENTS.enqueue(namespace, name, Cause.SCRAPE)


_judged: dict[tuple[str, str], Judged] = {}
metrics.tracked("telemetry.judged", lambda: len(_judged))


def held(key: tuple[str, str]) -> Judged | None:
    """The judgement held for `key` (taken: the pass that asks folds it in)."""
    return _judged.pop(key, None)
