"""An operator restart resumes every object without duplicating children and without writing anything
when nothing changed (API writes counted in the API server's audit log). Its own module, so that no other
operator instance is running meanwhile."""

from __future__ import annotations

import json
import os
from collections.abc import Container
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kopf.testing import KopfRunner
from kubernetes import client
from prometheus_client import REGISTRY

from .conftest import Cluster, eventually, get, sdep

pytestmark = pytest.mark.cluster


OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")  # kopf's own client and the kubernetes client it drives
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def operator_writes(
    audit_log: Path, since: str, namespace: str | None = None, codes: Container[int] | None = None
) -> list[str]:
    """The operator's writes since `since` (with `codes`: only those the API server answered so)."""
    out = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or event["requestReceivedTimestamp"] < since:
            continue
        if namespace is not None and event.get("objectRef", {}).get("namespace") != namespace:
            continue
        if codes is not None and (event.get("responseStatus") or {}).get("code") not in codes:
            continue
        if event["verb"] in WRITES and event.get("userAgent", "").startswith(OPERATOR_AGENTS):
            ref = event.get("objectRef", {})
            out.append(f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')}/{ref.get('name')}")
    return out


def reconciles() -> float:
    """The in-process operator's count of finished SpeculatorDeployment reconciles (its own metric)."""
    sample = REGISTRY.get_sample_value("speculator_reconciles_total", {"kind": "SpeculatorDeployment", "outcome": "ok"})
    return sample or 0.0


def _more(now: float, before: float) -> None:
    assert now > before, f"no reconcile yet ({now})"


def test_restart_converges_without_duplicates_or_writes(
    cluster: Cluster, operator_crds: list[str], store: dict[str, str], namespace: str, creds: str
) -> None:
    if cluster.local is None or cluster.local.audit_log is None:
        pytest.skip("needs the local control plane's audit log to count API requests")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    start = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with KopfRunner(args, timeout=60):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("steady", store, "good", creds))
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/steady", "--timeout=120s")

        # and the acceptance scrape of both its ready pods written (their kwok addresses are not dialled:
        # NoMetrics, each pod named); a scrape before the pods were ready says NoMetrics too, without them
        def scraped() -> None:
            acc = get(cluster, namespace, "sdep/steady")["status"].get("acceptance") or {}
            failing = (acc.get("pods") or {}).get("failing") or []
            assert len(failing) == 2, acc

        eventually(scraped, timeout=60)
        cluster.kubectl(
            "wait", "-n", namespace, "--for=condition=SpeculationEffective=Unknown", "sdep/steady", "--timeout=60s"
        )
    first_round = operator_writes(cluster.local.audit_log, start)
    assert any(w.startswith("patch deployments//steady") for w in first_round), first_round  # the counter counts
    before = {kind: get(cluster, namespace, f"{kind}/steady")["metadata"]["resourceVersion"]
              for kind in ("sdep", "deployment", "service", "pdb")}  # fmt: skip
    marker = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    reconciled = reconciles()
    with KopfRunner(args, timeout=60):  # a restarted operator reconciles every object it finds
        eventually(lambda: _more(reconciles(), reconciled), timeout=120)
    after = {kind: get(cluster, namespace, f"{kind}/steady")["metadata"]["resourceVersion"]
             for kind in ("sdep", "deployment", "service", "pdb")}  # fmt: skip
    assert after == before
    assert operator_writes(cluster.local.audit_log, marker) == []
    deployments = client.AppsV1Api(cluster.api).list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deployments] == ["steady"]
    replica_sets = client.AppsV1Api(cluster.api).list_namespaced_replica_set(namespace).items
    assert len(replica_sets) == 1
