"""The operator's event recorder (runtime/events.py): core/v1 Events about the object, posted in the background
in order per object, at most 25 at once per object and one more every 5 minutes (client-go's spam filter); and
a pass that fails for good (runtime/controller.py): not retried, said by Ready=False / Stalled=True with the reason
TerminalError and one Warning event."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel

from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime.controller import TERMINAL_ERROR, Controller, StatusRefused
from speculator_operator.runtime.events import MAX_MESSAGE, EventRecorder
from speculator_operator.runtime.workqueue import DONE, Result

LIMIT = 10.0


def sdep(name: str = "a", uid: str = "u-1", status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "speculators.dev/v1alpha1",
        "kind": "SpeculatorDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": 3},
        "spec": {},
        "status": status or {},
    }


class Posted:
    """A stand-in for the API server's events endpoint."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, namespace: str, body: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((namespace, body))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_event_names_its_object_and_the_operator_and_is_cut_to_1024_characters() -> None:
    posted = Posted()
    recorder = EventRecorder(posted, instance="operator-0")
    try:
        recorder.event(sdep(), type="Warning", reason="ApplyFailed", message="x" * 5000)
        assert recorder.flush(LIMIT)
    finally:
        recorder.close()
    ((namespace, body),) = posted.events
    assert namespace == "ns"
    assert body["involvedObject"] == {
        "apiVersion": "speculators.dev/v1alpha1",
        "kind": "SpeculatorDeployment",
        "namespace": "ns",
        "name": "a",
        "uid": "u-1",
    }
    assert (body["apiVersion"], body["kind"], body["metadata"]) == (
        "v1",
        "Event",
        {"generateName": "a.", "namespace": "ns"},
    )
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "ApplyFailed", 1)
    assert len(body["message"]) == MAX_MESSAGE
    assert body["source"] == {"component": "speculator-operator"}
    assert (body["reportingComponent"], body["reportingInstance"]) == ("speculator-operator", "operator-0")
    assert body["firstTimestamp"] == body["lastTimestamp"]
    assert "eventTime" not in body  # the API server would then want an `action` too


def test_an_objects_events_are_posted_in_order_and_a_failed_post_does_not_stop_the_others() -> None:
    posted = Posted()

    def create(namespace: str, body: dict[str, Any]) -> None:
        if body["reason"] == "R3":
            raise ConnectionError("the API server is away")
        posted(namespace, body)

    recorder = EventRecorder(create, posters=3)
    try:
        for i in range(10):
            recorder.event(sdep("a", "u-a"), type="Normal", reason=f"R{i}", message="")
            recorder.event(sdep("b", "u-b"), type="Normal", reason=f"R{i}", message="")
        assert recorder.flush(LIMIT)
    finally:
        recorder.close()
    for name in ("a", "b"):
        reasons = [b["reason"] for _, b in posted.events if b["involvedObject"]["name"] == name]
        assert reasons == [f"R{i}" for i in range(10) if i != 3]


def test_an_object_posts_25_events_at_once_then_one_every_5_minutes_and_others_are_not_held() -> None:
    posted, clock = Posted(), Clock()
    recorder = EventRecorder(posted, clock=clock)
    try:
        for i in range(30):
            recorder.event(sdep("a", "u-a"), type="Normal", reason="ChildRestored", message=f"{i}")
        recorder.event(sdep("b", "u-b"), type="Normal", reason="RollingOut", message="b")
        clock.now += 299
        recorder.event(sdep("a", "u-a"), type="Normal", reason="ChildRestored", message="early")
        clock.now += 1
        recorder.event(sdep("a", "u-a"), type="Normal", reason="ChildRestored", message="refilled")
        recorder.event(sdep("a", "u-a"), type="Normal", reason="ChildRestored", message="again")
        assert recorder.flush(LIMIT)
    finally:
        recorder.close()
    said = [b["message"] for _, b in posted.events if b["involvedObject"]["name"] == "a"]
    assert said == [*(f"{i}" for i in range(25)), "refilled"]
    assert [b["message"] for _, b in posted.events if b["involvedObject"]["name"] == "b"] == ["b"]
    assert recorder.dropped == 5 + 2


def test_the_rate_limit_keeps_the_objects_that_posted_last_and_no_more() -> None:
    recorder = EventRecorder(Posted(), max_objects=3, posters=1)
    try:
        for i in range(10):
            recorder.event(sdep(f"o{i}", f"u{i}"), type="Normal", reason="R", message="")
        assert recorder.objects() == 3
        assert recorder.flush(LIMIT)
    finally:
        recorder.close()


class Store:
    """kube's reads and status writes of SpeculatorDeployments, in memory."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj, self.writes = obj, []  # type: ignore[var-annotated]

    def read(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert (plural, namespace, name) == ("speculatordeployments", "ns", "a")
        return self.obj

    def write(
        self, plural: str, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any], cause: str
    ) -> None:
        self.writes.append((cause, kube.status_patch(old, new)))
        self.obj = {**self.obj, "status": new}


class Phase(BaseModel):
    phase: int


@pytest.mark.parametrize("bug", ["refused", "invalid"])
def test_a_pass_that_fails_for_good_is_not_retried_and_the_object_says_so_once(
    bug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stalled = {"type": "Reconciling", "status": "True", "reason": "RollingOut", "message": "", "observedGeneration": 2}
    store = Store(sdep(status={"phase": "Deploying", "observedGeneration": 2, "conditions": [stalled]}))
    monkeypatch.setattr(kube, "read_custom", store.read)
    monkeypatch.setattr(kube, "patch_status", store.write)
    monkeypatch.setattr(metrics, "tracked", lambda *_: None)  # the operator's own tables stay its queues'
    passes: list[frozenset[str]] = []

    def run(key: tuple[str, str], causes: frozenset[str]) -> Result:
        passes.append(causes)
        if "spec" in causes and len(passes) > 2:
            return DONE  # the spec edit that works around it
        if bug == "refused":
            raise StatusRefused("SpeculatorDeploymentStatus of ns/a: phase: Input should be 'Pending'")
        Phase.model_validate({"phase": "three"})  # a model the pass builds wrong
        return DONE

    posted = Posted()
    recorder = EventRecorder(posted)
    ctl = Controller("SpeculatorDeployment", workers=2, base_delay=0.001)
    ctl.handles(run)
    ctl.start(recorder)
    try:
        assert ctl.queue is not None
        ctl.enqueue("ns", "a", "scrape")
        assert ctl.queue.wait_idle(LIMIT)
        ctl.enqueue("ns", "a", "resync")  # the same error again: already said, nothing written or posted
        assert ctl.queue.wait_idle(LIMIT)
        ctl.enqueue("ns", "a", "spec")
        assert ctl.queue.wait_idle(LIMIT)
        assert recorder.flush(LIMIT)
    finally:
        ctl.stop()
        recorder.close()
    assert passes == [frozenset({"scrape"}), frozenset({"resync"}), frozenset({"spec"})]  # no retry
    assert len(store.writes) == 1
    cause, patch = store.writes[0]
    assert cause == "terminal"
    assert patch["observedGeneration"] == 3
    conditions = {c["type"]: c for c in store.obj["status"]["conditions"]}
    assert set(conditions) == {"Ready", "Stalled"}  # Reconciling gone: kstatus reads Stalled=True as Failed
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", TERMINAL_ERROR)
    assert (conditions["Stalled"]["status"], conditions["Stalled"]["reason"]) == ("True", TERMINAL_ERROR)
    assert conditions["Stalled"]["observedGeneration"] == 3
    named = "StatusRefused" if bug == "refused" else "ValidationError"
    assert named in conditions["Stalled"]["message"]
    ((_, event),) = posted.events
    assert (event["type"], event["reason"]) == ("Warning", TERMINAL_ERROR)
    assert named in event["message"]
    assert event["involvedObject"]["uid"] == "u-1"
