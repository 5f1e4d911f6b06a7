"""The one status write of a pass (runtime/kube.py `patch_status`), against the real API server: a merge patch
of what changed since the pass read the object, so an unchanged world writes nothing and a key the pass
dropped leaves the stored status; no resourceVersion precondition, so a user's spec edit between the pass's
read and its write is not turned into a 409 (the pass is the status's only writer: runtime/controller.py,
and tests/cluster/test_one_pass.py forces the overlaps that used to have several)."""

from __future__ import annotations

import json
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


def test_a_pass_writes_only_what_changed_and_a_spec_edit_meanwhile_is_no_conflict(
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
        "observedGeneration": 1,
        "readyReplicas": 0,
        "conditions": [
            cond("Ready", "False", "RollingOut", "0/1 replicas of revision r1 ready"),
            cond("SpeculationEffective", "Unknown", "NoMetrics"),
        ],
    }
    before = writes("reconcile")
    # what a first pass reads: the CRD's default before any write (docs/operations/gitops.md)
    assert get(cluster, namespace, "sdep/shared")["status"] == {"observedGeneration": 0}
    kube.patch_status(PLURAL, namespace, "shared", {"observedGeneration": 0}, rolling, "reconcile")
    assert writes("reconcile") == before + 1
    assert get(cluster, namespace, "sdep/shared")["status"] == rolling

    # the next pass read that; meanwhile the user edits the spec (a new generation, a new resourceVersion)
    read = get(cluster, namespace, "sdep/shared")["status"]
    patch = {"spec": {"serving": {"extraArgs": ["--seed", "1"]}}}
    cluster.kubectl("patch", "-n", namespace, "sdep/shared", "--type=merge", "-p", json.dumps(patch))
    # its write lands all the same: the conditions list is the pass's own (it read the stored one), a condition
    # it dropped is gone, and a key it dropped is removed
    ready = {"phase": "Ready", "observedGeneration": 2,
             "conditions": [cond("Ready", "True", "Ready", "1/1 replicas of revision r1 ready")]}  # fmt: skip
    kube.patch_status(PLURAL, namespace, "shared", read, ready, "child")
    stored = get(cluster, namespace, "sdep/shared")
    assert stored["status"] == ready
    assert stored["spec"]["serving"]["extraArgs"] == ["--seed", "1"]  # the edit stands too

    # a pass that changes nothing writes nothing, and is not counted
    before = writes("child")
    kube.patch_status(PLURAL, namespace, "shared", ready, ready, "child")
    assert writes("child") == before
    kube.patch_status(PLURAL, namespace, "shared", ready, {**ready, "readyReplicas": 1}, "child")
    assert writes("child") == before + 1
    assert get(cluster, namespace, "sdep/shared")["status"]["readyReplicas"] == 1

    # an object deleted between its pass's read and the write (a child event racing `kubectl delete`): nothing to
    # do rather than an error, and not counted
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shared")
    eventually(lambda: _gone(cluster, namespace, "sdep/shared"))
    before = writes("child")
    kube.patch_status(PLURAL, namespace, "shared", ready, {**ready, "readyReplicas": 3}, "child")
    assert writes("child") == before


def _gone(cluster: Cluster, namespace: str, what: str) -> None:
    found = cluster.kubectl("get", what, "-n", namespace, "--ignore-not-found", "-o", "name").stdout
    assert not found.strip(), found
