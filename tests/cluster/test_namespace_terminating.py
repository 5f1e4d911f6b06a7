"""A namespace being deleted refuses new objects with 403 NamespaceTerminating; the operator, which may not
read namespaces in a namespaced install, recognises that refusal from the API server's own answer and stops
(no retry, no ApplyFailed event) rather than "restoring" children the namespace controller is removing."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from speculator_operator.runtime.kube import namespace_terminating

from .conftest import Cluster, eventually

pytestmark = pytest.mark.cluster


def _phase(cluster: Cluster, namespace: str) -> str:
    out = cluster.kubectl("get", "namespace", namespace, "-o", "json")
    return str(json.loads(out.stdout)["status"]["phase"])


def _equal(a: object, b: object) -> None:
    assert a == b, f"{a!r} != {b!r}"


def test_a_create_in_a_terminating_namespace_is_told_apart_from_other_refusals(cluster: Cluster) -> None:
    namespace = f"terminating-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hold", "namespace": namespace, "finalizers": ["speculators.dev/test-hold"]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(held))
    apps = client.AppsV1Api(cluster.api)
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "child"},
        "spec": {
            "selector": {"matchLabels": {"app": "child"}},
            "template": {
                "metadata": {"labels": {"app": "child"}},
                "spec": {"containers": [{"name": "main", "image": "example.invalid/none"}]},
            },
        },
    }
    try:
        apps.create_namespaced_deployment(namespace, dep)
        with pytest.raises(ApiException) as exists:
            apps.create_namespaced_deployment(namespace, dep)
        assert exists.value.status == 409
        assert not namespace_terminating(exists.value)

        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        eventually(lambda: _equal(_phase(cluster, namespace), "Terminating"), timeout=60)
        with pytest.raises(ApiException) as refused:
            apps.create_namespaced_deployment(namespace, {**dep, "metadata": {"name": "restored"}})
        assert refused.value.status == 403
        assert namespace_terminating(refused.value), refused.value.body
    finally:
        patch = [{"op": "remove", "path": "/metadata/finalizers"}]
        cluster.kubectl("patch", "-n", namespace, "configmap/hold", "--type=json", "-p", json.dumps(patch))
        cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
