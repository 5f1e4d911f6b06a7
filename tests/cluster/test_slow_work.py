"""A pass that only folds in what a child said (a stage Job finished, a serving Deployment became ready) never
waits behind other objects' slow work, even when that work holds every worker that takes slow passes: on the
real control plane with the real S3 server, the operator in-process with small pools (this module's own
operator: 4 workers per kind and 2 quick ones), a test hook holding other objects' passes inside their apply
(standing for an audit or an S3 read that does not return) and every read of a stage pod's log hanging.

With one first-in first-out queue, or one pool for every pass, the stage transitions and the readiness below
wait for a held worker and never come (runtime/workqueue.py: quick causes are taken first, and the quick
workers take nothing else)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.controllers.queues import DEPLOYMENTS, TRAINJOBS

from .conftest import Cluster, eventually, get, sdep
from .test_trainjob_controller import OFFLINE_STAGES, slow_offline

pytestmark = pytest.mark.cluster

WORKERS, QUICK = 4, 2
LABEL = "speculators.dev/slow-work-test"


@pytest.fixture(scope="module")
def small_pools() -> Iterator[None]:
    kinds = (DEPLOYMENTS, TRAINJOBS)
    old = [(c.workers, c.quick_workers) for c in kinds]
    for c in kinds:
        c.workers, c.quick_workers = WORKERS, QUICK
    yield
    for c, (workers, quick) in zip(kinds, old, strict=True):
        c.workers, c.quick_workers = workers, quick


@pytest.fixture(scope="module")
def operator(small_pools: None, operator: KopfRunner) -> KopfRunner:
    """conftest's operator, started after this module's pools were set (its queues are made when it starts)."""
    return operator


class Gate:
    """The hook: a pass of an object named `slow-*` stops inside its apply until the gate opens."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.lock = threading.Lock()
        self.waiting: set[tuple[str, str]] = set()

    def __call__(self, namespace: str, name: str) -> None:
        if not name.startswith("slow-"):
            return
        with self.lock:
            self.waiting.add((namespace, name))
        self.open.wait(300)


def test_quick_passes_never_wait_behind_slow_work_that_holds_every_worker(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    workspace: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from speculator_operator.runtime import kube

    hung = threading.Event()
    monkeypatch.setattr(kube, "dialable", lambda ip: True)  # kwok's pods too: their log reads are attempted

    def pod_log(*args: Any, **kwargs: Any) -> str:
        hung.wait(300)
        return ""

    monkeypatch.setattr(kube, "pod_log", pod_log)
    # the objects whose quick passes must come through, their first (slow) passes done before the hold: a train job
    # whose stages take 5 s each, and a deployment whose pods have no node until the test labels one
    workspace("fast-workspace")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=slow_offline("fast", store, creds, "5s"))
    served = sdep("fast", store, "good", creds, nodeSelector={LABEL: namespace})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=served)
    eventually(lambda: _started(cluster, namespace))
    eventually(lambda: get(cluster, namespace, "deployment/fast"))
    gate = Gate()
    DEPLOYMENTS.on_apply = TRAINJOBS.on_apply = gate
    try:
        # one more slow object of each kind than there are workers: every worker that takes slow passes held
        slow = [json.loads(sdep(f"slow-{i}", store, "good", creds)) for i in range(WORKERS + 1)]
        slow += [json.loads(slow_offline(f"slow-t{i}", store, creds, "1s")) for i in range(WORKERS + 1)]
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                                "items": slow}))  # fmt: skip
        eventually(lambda: _equal(len(gate.waiting), 2 * WORKERS), timeout=120)
        before = _succeeded(cluster, namespace)
        assert before < len(OFFLINE_STAGES), "the train job ended before the hold: nothing was shown"
        cluster.kubectl("label", "nodes", "-l", "type=kwok", f"{LABEL}={namespace}")
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/fast", "--timeout=120s", timeout=130)
        cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "stj/fast",
                        "--timeout=240s", timeout=260)  # fmt: skip
        # the slow ones were still held, and the ones beyond the workers still queued, when both came through
        assert len(gate.waiting) == 2 * WORKERS
        assert not gate.open.is_set()
    finally:
        gate.open.set()
        hung.set()
        DEPLOYMENTS.on_apply = TRAINJOBS.on_apply = None
        cluster.kubectl("label", "nodes", "-l", "type=kwok", f"{LABEL}-")
    st = get(cluster, namespace, "stj/fast")["status"]
    assert [(s["name"], s["phase"]) for s in st["stages"]] == [(s, "Succeeded") for s in OFFLINE_STAGES]


def _started(cluster: Cluster, namespace: str) -> None:
    status = get(cluster, namespace, "stj/fast").get("status") or {}  # none yet right after the apply
    assert status.get("stage"), status


def _succeeded(cluster: Cluster, namespace: str) -> int:
    stages = (get(cluster, namespace, "stj/fast").get("status") or {}).get("stages") or []
    return sum(s.get("phase") == "Succeeded" for s in stages)


def _equal(a: object, b: object) -> None:
    assert a == b, f"{a!r} != {b!r}"
