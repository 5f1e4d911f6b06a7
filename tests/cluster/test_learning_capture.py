"""spec.learning's capture as the operator renders it, against the real control plane: the serving pods get the
middleware and their settings, a missing credentials Secret turns the capture off without stopping serving (and
its arrival turns it on, with no edit and no rollout), and turning learning off takes the ConfigMap away."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kopf.testing import KopfRunner
from kubernetes import client

from speculator_operator.api.podcontract import CAPTURE_MIDDLEWARE
from speculator_operator.render import capture

from .conftest import Cluster, eventually, get, sdep

pytestmark = pytest.mark.cluster

TEMPLATE = {"algorithm": "eagle3", "data": {"sources": ["hf:org/chats"]}, "output": {"uri": "s3://drafts/q"}}


def learning_sdep(store: dict[str, str], creds: str) -> str:
    body = json.loads(sdep("qwen", store, "good", creds))
    body["spec"]["upgradePolicy"] = {"canary": {}, "trainTemplate": TEMPLATE}
    body["spec"]["learning"] = {
        "capture": {"fraction": 0.5},
        "storage": {"location": "s3://captures/qwen", "credentials": {"name": "capture-writer"}},
    }
    return json.dumps(body)


def settings(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    found = cluster.kubectl("get", "-n", namespace, "configmap/qwen-capture", "-o", "json", check=False)
    if found.returncode != 0:
        return None
    return json.loads(json.loads(found.stdout)["data"][capture.CONFIG_KEY])  # type: ignore[no-any-return]


def capture_is(cluster: Cluster, namespace: str, key: str, value: Any) -> None:
    found = settings(cluster, namespace)
    assert found is not None
    assert found[key] == value


def notes(cluster: Cluster, namespace: str) -> list[str]:
    return [n["reason"] for n in get(cluster, namespace, "sdep/qwen")["status"].get("renderNotes") or []]


def test_the_capture_waits_for_its_secret_and_serving_does_not(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=learning_sdep(store, creds))
    # serving goes on without the Secret: the pods mount it optionally, the capture is off and the status says why
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/qwen", "--timeout=120s")
    assert notes(cluster, namespace) == [capture.CAPTURE_CREDENTIALS_UNREADABLE]
    found = settings(cluster, namespace)
    assert found is not None
    assert (found["enabled"], found["fraction"]) == (False, 0.5)
    status = get(cluster, namespace, "sdep/qwen")["status"]
    assert status["learning"] == {}
    revision = status["revision"]
    (container,) = get(cluster, namespace, "deployment/qwen")["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--middleware") + 1] == CAPTURE_MIDDLEWARE

    # the Secret arrives: the next resync's reconcile reads it, and the pods capture without a rollout
    client.CoreV1Api(cluster.api).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="capture-writer"), string_data={"AWS_ACCESS_KEY_ID": "writer"}))  # fmt: skip
    eventually(lambda: capture_is(cluster, namespace, "enabled", True), timeout=90)
    assert notes(cluster, namespace) == []
    assert get(cluster, namespace, "sdep/qwen")["status"]["revision"] == revision

    # a live change: the ConfigMap moves, the revision does not
    cluster.kubectl("patch", "-n", namespace, "sdep/qwen", "--type=merge",
                    "-p", json.dumps({"spec": {"learning": {"capture": {"fraction": 0.2}}}}))  # fmt: skip
    eventually(lambda: capture_is(cluster, namespace, "fraction", 0.2))
    assert get(cluster, namespace, "sdep/qwen")["status"]["revision"] == revision

    # learning off: the ConfigMap goes, the pods roll without the middleware, status.learning is removed
    cluster.kubectl("patch", "-n", namespace, "sdep/qwen", "--type=json",
                    "-p", json.dumps([{"op": "remove", "path": "/spec/learning"}]))  # fmt: skip

    def gone() -> dict[str, Any]:
        assert settings(cluster, namespace) is None
        found: dict[str, Any] = get(cluster, namespace, "sdep/qwen")["status"]
        assert "learning" not in found
        return found

    status = eventually(gone)
    assert status["revision"] != revision
    (container,) = get(cluster, namespace, "deployment/qwen")["spec"]["template"]["spec"]["containers"]
    assert "--middleware" not in container["args"]
