"""A scrape job launched for a SpeculatorDeployment that is deleted before or while it runs keeps nothing by
that object: its DELETED event has already run the on_gone callbacks, which will not run again (the burst
test found one acceptance window left this way after every object was gone)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from speculator_operator.controllers import telemetry, watches
from speculator_operator.planning.watched import trimmed_pod
from speculator_operator.runtime import scheduler as periodic
from speculator_operator.telemetry.vllm_metrics import Window

# names no cluster test uses: an operator run in this process before may have left series of its own
NAMESPACE, NAME, UID = "unit-telemetry-gone", "pair", "unit-telemetry-gone-uid"


def body() -> kopf.Body:
    raw: Any = {
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID, "generation": 1},
        "spec": {
            "verifier": {"model": "Qwen/Qwen3-8B"},
            "speculator": {"source": "hf://acme/d"},
            "serving": {"replicas": 1},
        },
        "status": {"phase": "Ready", "revision": "r1", "numSpeculativeTokens": 3, "algorithm": "eagle3"},
    }
    return kopf.Body(raw)


@pytest.fixture
def scrape(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A live object with one ready serving pod; the passes the job asks for (its key enqueued), recorded."""
    pod = {
        "metadata": {"name": "p0", "labels": {"speculators.dev/revision": "r1"}},
        "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 9}]}]},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    monkeypatch.setattr(telemetry, "_pods", {(NAMESPACE, NAME): [trimmed_pod(pod)]})
    enqueued: list[Any] = []
    monkeypatch.setattr(telemetry.DEPLOYMENTS, "enqueue", lambda *key_and_cause: enqueued.append(key_and_cause))
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    periodic.seen(telemetry.PLURAL, body(), "ADDED")
    yield enqueued
    periodic.seen(telemetry.PLURAL, body(), "DELETED")
    telemetry.forget(NAMESPACE, NAME)


def run_scrape() -> None:
    """One scrape job, launched the way the periodic loop launches it."""

    async def once() -> None:
        try:
            await periodic.while_tracked(telemetry.PLURAL, UID, telemetry.scrape_acceptance, body())
        finally:
            await telemetry.close_client()  # the real client session, bound to this loop

    asyncio.run(once())


def kept() -> dict[str, bool]:
    return {
        "window": UID in telemetry._windows,
        "ready": UID in telemetry._ready_since,
        "positions": (NAMESPACE, NAME) in telemetry._positions,
        "judged": (NAMESPACE, NAME) in telemetry._judged,
        "series": any(
            (sample.labels.get("namespace"), sample.labels.get("name")) == (NAMESPACE, NAME)
            for family in telemetry.RUNNING.collect()
            for sample in family.samples
        ),
    }


def test_a_live_object_is_measured_and_kept(scrape: list[Any]) -> None:
    run_scrape()
    assert kept() == {"window": True, "ready": True, "positions": False, "series": True, "judged": True}
    # the failed scrape is to be said in status: held for the object's pass, which is asked for
    assert scrape == [(NAMESPACE, NAME, "scrape")]


def test_an_object_deleted_before_its_job_runs_keeps_nothing(scrape: list[Any]) -> None:
    periodic.seen(telemetry.PLURAL, body(), "DELETED")
    run_scrape()
    assert kept() == {"window": False, "ready": False, "positions": False, "series": False, "judged": False}
    assert scrape == []


def test_an_object_deleted_during_its_scrape_keeps_nothing(scrape: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    async def deleted_meanwhile(window: Window, target: dict[str, Any], now: float, also: Any = None) -> None:
        periodic.seen(telemetry.PLURAL, body(), "DELETED")  # the watch's event, handled while the GET waits

    monkeypatch.setattr(telemetry, "_scrape_one", deleted_meanwhile)
    run_scrape()
    assert kept() == {"window": False, "ready": False, "positions": False, "series": False, "judged": False}
    assert scrape == []


def test_a_job_launched_before_the_deleted_event_does_not_run(scrape: list[Any]) -> None:
    """The loop launches a task; the DELETED event is handled before the task starts (poll_inputs would keep
    when it last polled the object, for ever)."""
    task = periodic.while_tracked(telemetry.PLURAL, UID, watches.poll_inputs, body())
    periodic.seen(telemetry.PLURAL, body(), "DELETED")
    asyncio.run(task)
    assert UID not in watches._polled
    periodic.seen(telemetry.PLURAL, body(), "ADDED")
    asyncio.run(periodic.while_tracked(telemetry.PLURAL, UID, watches.poll_inputs, body()))
    assert UID in watches._polled  # a live object's job runs
