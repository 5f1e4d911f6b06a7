"""Children changed or deleted by hand are put back (kubectl scale, kubectl patch, kubectl delete, against the
real API server; the operator in-process), each restoration said once by a ChildRestored event and costing
a handful of writes (the API server's audit log), while what someone else adds (a label, an env var: fields
the operator does not set) is left to them, as server-side apply has it."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.controllers.queues import DEPLOYMENTS

from .conftest import Cluster, eventually, get, sdep
from .test_deployment_restart import operator_writes

pytestmark = pytest.mark.cluster


def container(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    dep = get(cluster, namespace, f"deployment/{name}")
    return dep["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def uid(cluster: Cluster, namespace: str, what: str) -> str:
    return get(cluster, namespace, what)["metadata"]["uid"]  # type: ignore[no-any-return]


def restored_events(cluster: Cluster, namespace: str) -> list[str]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=ChildRestored", "-o", "json")
    return [e["message"] for e in json.loads(out.stdout)["items"]]


def test_children_changed_or_deleted_by_hand_are_restored_once_each(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("drift", store, "good", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/drift", "--timeout=120s")
    original = container(cluster, namespace, "drift")
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # kubectl scale: the scale subresource takes spec.replicas
    cluster.kubectl("scale", "-n", namespace, "deployment/drift", "--replicas=5")
    eventually(lambda: _equal(get(cluster, namespace, "deployment/drift")["spec"]["replicas"], 2), timeout=60)

    # kubectl patch of the serving command line
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["--model", "other"]}]
    cluster.kubectl("patch", "-n", namespace, "deployment/drift", "--type=json", "-p", json.dumps(patch))
    eventually(lambda: _equal(container(cluster, namespace, "drift")["args"], original["args"]), timeout=60)

    # deleted children come back as new objects
    for what in ("service/drift", "poddisruptionbudget/drift", "deployment/drift"):
        before = uid(cluster, namespace, what)
        cluster.kubectl("delete", "-n", namespace, what, "--wait=true")
        eventually(lambda w=what, b=before: _differ(uid(cluster, namespace, w), b), timeout=60)  # type: ignore[misc]
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/drift", "--timeout=120s")

    # a label, or an env var, someone adds is theirs: a field the operator does not set, nothing to restore
    # (the scale after them is: its restoration comes after their events, handled in order, were handled)
    cluster.kubectl("label", "-n", namespace, "deployment/drift", "team=inference")
    extra = {
        "spec": {
            "template": {
                "spec": {"containers": [{"name": original["name"], "env": [{"name": "TEAM", "value": "inference"}]}]}
            }
        }
    }
    cluster.kubectl("patch", "-n", namespace, "deployment/drift", "-p", json.dumps(extra))
    cluster.kubectl("scale", "-n", namespace, "deployment/drift", "--replicas=3")
    events = eventually(lambda: _count(restored_events(cluster, namespace), 6), timeout=60)
    assert sorted(e.split(" was ")[0] for e in events) == [
        *["Deployment drift"] * 4,
        "PodDisruptionBudget drift",
        "Service drift",
    ], events
    assert sum("changed by kubectl" in e for e in events) == 3, events
    assert get(cluster, namespace, "deployment/drift")["metadata"]["labels"]["team"] == "inference"
    assert {"name": "TEAM", "value": "inference"} in container(cluster, namespace, "drift")["env"]
    eventually(lambda: _equal(get(cluster, namespace, "deployment/drift")["spec"]["replicas"], 2), timeout=60)
    if cluster.local is not None and cluster.local.audit_log is not None:
        kinds = ("deployments", "services", "poddisruptionbudgets")
        stored = operator_writes(cluster.local.audit_log, since, namespace, codes=range(200, 300))  # this test's
        refused = operator_writes(cluster.local.audit_log, since, namespace, codes=(409,))
        # six restorations, each applying the three children once: no write storm; an apply is refused only
        # when its child moved between the read right before it and the apply (a rolling Deployment's status)
        assert len([w for w in stored if w.split()[1].split("/")[0] in kinds]) <= 18, stored
        assert len([w for w in refused if w.split()[1].split("/")[0] in kinds]) <= 6, refused

    # an edit landing while a restoration is under way (the test hook runs it just before the pass applies): the
    # apply, made against the object the pass read, is refused, reads the child again and takes that edit back
    # too; one event names whom it was taken from, and the edit's own event finds nothing left to restore
    landed = threading.Event()

    def scale_now(ns: str, name: str) -> None:
        if (ns, name) == (namespace, "drift") and not landed.is_set():
            landed.set()
            cluster.kubectl("scale", "-n", namespace, "deployment/drift", "--replicas=4")

    more = {
        "spec": {
            "template": {"spec": {"containers": [{"name": original["name"], "env": [{"name": "MORE", "value": "1"}]}]}}
        }
    }
    DEPLOYMENTS.on_apply = scale_now
    try:
        cluster.kubectl("patch", "-n", namespace, "deployment/drift", "-p", json.dumps(more))
        events = eventually(lambda: _count(restored_events(cluster, namespace), 7), timeout=60)
    finally:
        DEPLOYMENTS.on_apply = None
    assert landed.is_set()
    eventually(lambda: _equal(get(cluster, namespace, "deployment/drift")["spec"]["replicas"], 2), timeout=60)
    assert {"name": "MORE", "value": "1"} in container(cluster, namespace, "drift")["env"]
    assert sorted(e.split(" was ")[0] for e in events).count("Deployment drift") == 5, events
    assert sum("changed by kubectl" in e for e in events) == 4, events


def _equal(a: object, b: object) -> None:
    assert a == b, f"{a!r} != {b!r}"


def _differ(a: object, b: object) -> None:
    assert a != b, f"still {a!r}"


def _count(items: list[str], n: int) -> list[str]:
    assert len(items) >= n, items
    return items
