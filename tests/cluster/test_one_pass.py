"""One pass per object at a time, with the overlap forced rather than hoped for: a hook holds each round's pass
inside its apply until the next trigger of the same object has arrived (runtime/controller.py
`Controller.on_apply`), on the real control plane with the real S3 server and the operator in-process.

The triggers are the ones that used to apply children from their own copies of the object: a spec edit, a
child scaled by hand (a drift restore), and an input poll after the draft's bytes changed in place (a poll
redeploy). The tuning rollout goes through the same step of the pass as a spec edit (`_Pass.reconcile`) and is
not driven here: it needs a window of scripted acceptance (test_tuning.py). Asserted:

- the child's template never returns to an earlier revision (no A -> B -> A) and its generation rises by at
  most the revisions the inputs imply plus the hand scales and their restorations;
- status writes <= passes (`speculator_passes_total` beside `speculator_status_writes_total`);
- the API server's own count of 409 answers to status writes of the kind does not move;
- it ends serving the last inputs: the last spec edit's arguments and the last draft bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner
from kubernetes import client, watch
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from speculator_operator.controllers.queues import DEPLOYMENTS, TRAINJOBS
from speculator_operator.runtime.controller import Controller

from ..ckptgen import eagle3, write_checkpoint
from .conftest import SMALL, Cluster, eventually, get, sdep
from .test_deployment_restart import operator_writes
from .test_trainjob_controller import OFFLINE_STAGES, slow_offline, stage_job_writes

pytestmark = pytest.mark.cluster

ROUNDS = 20


def operator_count(name: str, kind: str = "SpeculatorDeployment") -> float:
    """The in-process operator's own counter `name`, summed over its series of the kind."""
    total = 0.0
    for family in REGISTRY.collect():
        for s in family.samples:
            if s.name == name and s.labels.get("kind") == kind:
                total += s.value
    return total


def status_conflicts(cluster: Cluster, resource: str = "speculatordeployments") -> float:
    """apiserver_request_total{resource=...,subresource="status",code="409"}, summed."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if (
                s.name == "apiserver_request_total"
                and labels.get("resource") == resource
                and labels.get("subresource") == "status"
                and labels.get("code") == "409"
            ):
                total += s.value
    return total


class Held:
    """The hook: when armed, the pass of `key` that reaches its apply signals `holding` and stays there until
    the test has sent its next trigger (`sent`) and that trigger has been enqueued for the same key (60 s at
    most each: `missed` counts the holds that gave up)."""

    def __init__(self, key: tuple[str, str], controller: Controller = DEPLOYMENTS) -> None:
        self.key, self.controller = key, controller
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.sent = threading.Event()
        self.released = threading.Event()
        self.held = 0
        self.missed = 0

    def arm(self) -> None:
        self.holding.clear()
        self.sent.clear()
        self.released.clear()
        self.armed.set()

    def __call__(self, namespace: str, name: str) -> None:
        if (namespace, name) != self.key or not self.armed.is_set():
            return
        self.armed.clear()
        self.holding.set()
        queue = self.controller.queue
        assert queue is not None
        arrived = self.sent.wait(60)
        if arrived:
            try:
                eventually(lambda: _pending(queue, self.key), timeout=60, interval=0.1)
            except AssertionError:  # counted: the test asserts that no hold missed its trigger
                arrived = False
        self.held += arrived
        self.missed += not arrived
        self.released.set()


@pytest.fixture
def templates(cluster: Cluster, namespace: str) -> Iterator[list[str]]:
    """The child Deployment's template revision after every change the API server reports, in order."""
    seen: list[str] = []
    stop = threading.Event()
    w = watch.Watch()

    def follow() -> None:
        apps = client.AppsV1Api(cluster.api)
        while not stop.is_set():
            try:
                for event in w.stream(
                    apps.list_namespaced_deployment,
                    namespace,
                    field_selector="metadata.name=overlap",
                    timeout_seconds=5,
                ):
                    annotations = event["object"].spec.template.metadata.annotations or {}
                    revision = annotations.get("speculators.dev/revision")
                    if revision and (not seen or seen[-1] != revision):
                        seen.append(revision)
                    if stop.is_set():
                        break
            except Exception:  # a watch that ends early is started again
                if stop.is_set():
                    break

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    yield seen
    stop.set()
    w.stop()
    thread.join(timeout=10)


def child(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get(cluster, namespace, "deployment/overlap")


def test_overlapping_triggers_at_one_deployment_never_take_its_revision_back(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
    templates: list[str],
) -> None:
    bucket = store["good"].removeprefix("s3://").split("/")[0]
    prefix = f"overlap-{namespace}"
    weights = tmp_path / "draft"
    write_checkpoint(weights, *eagle3(SMALL, draft_vocab=1024), sparse=False, fill=b"\x00")
    for path in sorted(weights.iterdir()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    doc = json.loads(sdep("overlap", {**store, "mine": f"s3://{bucket}/{prefix}"}, "mine", creds))
    doc["spec"]["serving"]["replicas"] = 1
    doc["spec"]["upgradePolicy"] = {"onDraftChange": "Redeploy", "pollIntervalSeconds": 86400}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/overlap", "--timeout=120s")
    key = (namespace, "overlap")
    queue = DEPLOYMENTS.queue
    assert queue is not None
    eventually(lambda: _idle(queue, key), timeout=60)

    generation0 = int(child(cluster, namespace)["metadata"]["generation"])
    revisions0 = len(templates)
    writes0, passes0 = operator_count("speculator_status_writes_total"), operator_count("speculator_passes_total")
    conflicts0 = status_conflicts(cluster)
    scales = 0
    seeds: list[str] = []
    hook = Held(key)
    DEPLOYMENTS.on_apply = hook
    try:
        for round_ in range(ROUNDS):

            def edit_spec(r: int = round_) -> None:
                seeds.append(str(r))
                patch = {"spec": {"serving": {"extraArgs": ["--seed", str(r)]}}}
                cluster.kubectl("patch", "-n", namespace, "sdep/overlap", "--type=merge", "-p", json.dumps(patch))

            def new_draft(r: int = round_) -> None:
                write_checkpoint(weights, *eagle3(SMALL, draft_vocab=1024), sparse=False, fill=bytes([r + 1]))
                s3.upload_file(str(weights / "model.safetensors"), bucket, f"{prefix}/model.safetensors")
                DEPLOYMENTS.enqueue(namespace, "overlap", "poll")  # what the poll job does once it is due

            def scale() -> None:
                cluster.kubectl("scale", "-n", namespace, "deployment/overlap", "--replicas=3")

            triggers = [edit_spec, new_draft, scale]
            first, second = triggers[round_ % 3], triggers[(round_ + 1) % 3]
            scales += (first is scale) + (second is scale)
            hook.arm()
            first()
            assert hook.holding.wait(60), f"round {round_}: no pass reached its apply after {first.__name__}"
            second()  # while the first trigger's pass is held inside its apply
            hook.sent.set()
            assert hook.released.wait(90)
            eventually(lambda: _idle(queue, key), timeout=60)
    finally:
        DEPLOYMENTS.on_apply = None
    assert hook.missed == 0
    assert hook.held == ROUNDS

    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/overlap", "--timeout=120s")
    status = get(cluster, namespace, "sdep/overlap")["status"]
    dep = child(cluster, namespace)
    served = dep["spec"]["template"]["metadata"]["annotations"]["speculators.dev/revision"]
    eventually(lambda: _equal(templates[-1], served), timeout=30)

    # no A -> B -> A: every revision the template took is new
    assert len(set(templates)) == len(templates), templates
    # each round brings one or two new revisions (a spec edit, new draft bytes); a hand scale and its
    # restoration move the generation without a new template
    new_revisions = len(templates) - revisions0
    assert new_revisions <= 2 * ROUNDS
    assert int(dep["metadata"]["generation"]) - generation0 <= new_revisions + 2 * scales
    # the pair it ends with is the last inputs'
    assert status["revision"] == served
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--seed", seeds[-1]]
    # one status write per pass at most, and not one refused for a stale resourceVersion
    writes = operator_count("speculator_status_writes_total") - writes0
    passes = operator_count("speculator_passes_total") - passes0
    assert 0 < writes <= passes
    assert status_conflicts(cluster) == conflicts0


def test_a_train_job_edited_while_its_stage_jobs_finish_starts_each_stage_once(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    """Each pass that applies a stage's children is held until a spec edit (retries, a field that may change
    mid-run) has arrived; the stage Jobs finish meanwhile (kwok, 2 s a pod)."""
    workspace("edited-workspace")
    key = (namespace, "edited")
    start = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    writes0 = operator_count("speculator_status_writes_total", "SpeculatorTrainJob")
    passes0 = operator_count("speculator_passes_total", "SpeculatorTrainJob")
    conflicts0 = status_conflicts(cluster, "speculatortrainjobs")
    hook = Held(key, TRAINJOBS)
    TRAINJOBS.on_apply = hook
    edits = 0
    try:
        hook.arm()
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=slow_offline("edited", store, creds, "2s"))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if not hook.holding.wait(0.5):
                if get(cluster, namespace, "stj/edited").get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    break
                continue
            edits += 1
            patch = {"spec": {"retries": 1 + edits % 5}}  # differs from the last value each time
            cluster.kubectl("patch", "-n", namespace, "stj/edited", "--type=merge", "-p", json.dumps(patch))
            hook.sent.set()
            assert hook.released.wait(90)
            hook.arm()
    finally:
        TRAINJOBS.on_apply = None
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "stj/edited", "--timeout=180s")
    assert hook.missed == 0
    assert edits >= len(OFFLINE_STAGES)  # one held apply per stage at least (servers add theirs)
    obj = get(cluster, namespace, "stj/edited")
    assert [s["name"] for s in obj["status"]["stages"]] == OFFLINE_STAGES
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    # each stage's Job written exactly once, whatever arrived while it was applied
    assert cluster.local is not None
    assert cluster.local.audit_log is not None
    stage_job_writes(operator_writes(Path(cluster.local.audit_log), start, namespace), "edited")
    writes = operator_count("speculator_status_writes_total", "SpeculatorTrainJob") - writes0
    passes = operator_count("speculator_passes_total", "SpeculatorTrainJob") - passes0
    assert 0 < writes <= passes
    assert status_conflicts(cluster, "speculatortrainjobs") == conflicts0


def _pending(queue: Any, key: tuple[str, str]) -> None:
    assert queue.pending(key), f"no trigger of {key} queued"


def _idle(queue: Any, key: tuple[str, str]) -> None:
    assert not queue.pending(key)
    assert not queue.processing(key)


def _equal(a: object, b: object) -> None:
    assert a == b, f"{a!r} != {b!r}"
