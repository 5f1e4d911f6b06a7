"""Pod Security on the real API server (its PodSecurity admission, not a hand-written check): in a namespace
that enforces `restricted`, the operator's own pod, the serving pods and the stage pods are admitted; a
pod the API server refuses (here: a quota that admits none) is said in the API server's words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from .conftest import Cluster, eventually, get, sdep, stj
from .test_helm_chart import CHART, helm

pytestmark = pytest.mark.cluster
RESTRICTED = ("pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest")


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return json.loads(out.stdout)["items"]  # type: ignore[no-any-return]


def test_the_operator_serving_and_stage_pods_are_admitted_under_restricted(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, tmp_path: Path
) -> None:
    cluster.kubectl("label", "namespace", namespace, *RESTRICTED)
    # the operator's own pod, from its chart (kwok plays it once the API server has admitted it)
    release = f"so-{namespace[-6:]}"
    helm(cluster, tmp_path, "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "90s")
    assert pods(cluster, namespace, "app.kubernetes.io/name=speculator-operator")
    helm(cluster, tmp_path, "uninstall", release, "-n", namespace, "--wait")
    # serving pods (init containers that stage the draft and the verifier, vLLM)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("served", store, "good", creds, replicas=1))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/served", "--timeout=120s")
    assert len(pods(cluster, namespace, "speculators.dev/deployment=served")) == 1
    # a train job's first stage pod
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=stj("trained", store, creds))

    def stage_pod() -> dict[str, Any]:
        found = pods(cluster, namespace, "speculators.dev/trainjob=trained")
        assert found, "no stage pod admitted yet"
        return found[0]

    pod = eventually(stage_pod, timeout=120)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    warnings = [
        e for e in get(cluster, namespace, "events")["items"] if "PodSecurity" in (e.get("message") or "")
    ]  # nothing was refused on the way
    assert warnings == []


def test_a_pod_the_api_server_refuses_is_said_in_its_words(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(quota))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("refused", store, "good", creds, replicas=1))

    def said() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/refused").get("status") or {}
        serving = next((c for c in st.get("conditions") or [] if c["type"] == "Serving"), {})
        assert serving.get("reason") == "FailedCreate", serving
        return serving

    serving = eventually(said, timeout=120)
    assert "exceeded quota" in serving["message"]
    ready = next(c for c in get(cluster, namespace, "sdep/refused")["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"

    # a train job's stage Job: the Job controller tells the refusal only in an event on the Job, which the
    # run's resync (SPECULATOR_RESYNC_SECONDS, 15 s here, while a run is in flight) reads
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=stj("refused", store, creds))

    def stage_said() -> dict[str, Any]:
        st = get(cluster, namespace, "stj/refused").get("status") or {}
        # a started run has no Ready until it ends (docs/operations/gitops.md): Failed=False says what holds it
        cond = next((c for c in st.get("conditions") or [] if c["type"] == "Failed"), {})
        assert cond.get("reason") == "FailedCreate", cond
        return cond

    cond = eventually(stage_said, timeout=180, interval=2)
    assert "exceeded quota" in cond["message"]
    assert cond["message"].startswith("stage fetch: job refused-fetch: "), cond["message"]
