"""Several writers share one status: the reconcile, the child events, the timers, whose copy of the object
may be minutes old under load. A writer with a stale copy must not overturn what it did not change — at
1,000 resources one did: a timer's conditions list, from before the rollout finished, replaced the whole
list and left a ready resource at `Ready=False, RollingOut 0/1` until the next change (real API server)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from prometheus_client import REGISTRY

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.runtime import kube

from .conftest import Cluster, eventually, get

pytestmark = pytest.mark.cluster
PLURAL = "speculatordeployments"


def writes(cause: str, kind: str = "SpeculatorDeployment") -> float:
    """The operator's count of its stored status writes for `cause` (its own metric)."""
    labels = {"kind": kind, "cause": cause}
    return REGISTRY.get_sample_value("speculator_status_writes_total", labels) or 0.0


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": "2026-12-01T06:00:00Z",
    }


def test_a_stale_writer_does_not_overturn_a_condition_it_did_not_change(
    cluster: Cluster, operator_crds: list[str], namespace: str
) -> None:
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube.load_config()
    objects = kube.client.CustomObjectsApi(kube.api())
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpeculatorDeployment",
        "metadata": {"name": "shared"},
        "spec": {"verifier": {"model": "s3://b/verifier"}, "speculator": {"source": "s3://b/draft"}},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    rolling = {
        "phase": "Deploying",
        "readyReplicas": 0,
        "conditions": [cond("Ready", "False", "RollingOut", "0/1 replicas of revision r1 ready")],
    }
    kube.write_status(PLURAL, namespace, "shared", {}, rolling, "reconcile")
    # the child event's writer: the rollout finished
    ready = {
        **rolling,
        "phase": "Ready",
        "readyReplicas": 1,
        "conditions": [cond("Ready", "True", "Ready", "1/1 replicas of revision r1 ready")],
    }
    kube.write_status(PLURAL, namespace, "shared", rolling, ready, "child")
    # a timer that read the object before that: it adds its own condition to its (stale) copy
    stale = copy.deepcopy(rolling)
    judged = {**stale, "conditions": [*stale["conditions"], cond("SpeculationEffective", "Unknown", "NoMetrics")]}
    kube.write_status(PLURAL, namespace, "shared", stale, judged, "scrape")

    status = get(cluster, namespace, "sdep/shared")["status"]
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["status"] == "True", status  # the stale writer did not change it: it stands
    assert by_type["SpeculationEffective"]["reason"] == "NoMetrics"  # what it did change landed
    assert (status["phase"], status["readyReplicas"]) == ("Ready", 1)

    # a writer that does change a condition still changes it, and one that drops a condition drops it
    dropped = {**ready, "conditions": [cond("Ready", "False", "RollingOut", "0/1 replicas of revision r2 ready")]}
    kube.write_status(
        PLURAL,
        namespace,
        "shared",
        {**ready, "conditions": [*ready["conditions"], cond("SpeculationEffective", "Unknown", "NoMetrics")]},
        dropped,
        "child",
    )
    status = get(cluster, namespace, "sdep/shared")["status"]
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "False")]

    # the operator counts the writes it stored, by cause; one that changes nothing is not a write
    before = writes("child")
    kube.write_status(PLURAL, namespace, "shared", dropped, dropped, "child")
    assert writes("child") == before
    kube.write_status(PLURAL, namespace, "shared", dropped, {**dropped, "readyReplicas": 2}, "child")
    assert writes("child") == before + 1
    assert get(cluster, namespace, "sdep/shared")["status"]["readyReplicas"] == 2

    # a writer whose copy predates a transition that already landed computes the same status, with a
    # transition time of its own: nothing is written, and the stored transition time stands
    stored = get(cluster, namespace, "sdep/shared")["status"]
    before = writes("resync")
    late = [{**c, "lastTransitionTime": "2026-12-01T07:00:00Z"} for c in stored["conditions"]]
    kube.write_status(PLURAL, namespace, "shared", ready, {**stored, "conditions": late}, "resync")
    assert writes("resync") == before
    assert get(cluster, namespace, "sdep/shared")["status"] == stored

    # an object deleted between its read and the write (a child event racing `kubectl delete`): a write to
    # it, with or without conditions, is nothing to do rather than an error, and is not counted
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shared")
    eventually(lambda: _gone(cluster, namespace, "sdep/shared"))
    before = writes("child")
    kube.write_status(PLURAL, namespace, "shared", stored, {**stored, "readyReplicas": 3}, "child")
    kube.write_status(PLURAL, namespace, "shared", stored, {**stored, "conditions": []}, "child")
    assert writes("child") == before


def _gone(cluster: Cluster, namespace: str, what: str) -> None:
    found = cluster.kubectl("get", what, "-n", namespace, "--ignore-not-found", "-o", "name").stdout
    assert not found.strip(), found
