"""API server faults on the real control plane: the API server is stopped while a rollout is in flight,
etcd's history is compacted meanwhile, and the API server starts again in place. The operator's watches
resume from a resource version that no longer exists (410 Gone, seen in kopf's own log line), and the
resource still reaches the state it would have reached without the fault, with no child made twice. And
a train job between stages across a plain restart (no compaction: the watches resume where they were): every
stage once, the run succeeds, and the outage is told in warning lines, not tracebacks."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kopf.testing import KopfRunner

from .conftest import Cluster, eventually, get, sdep
from .test_deployment_restart import operator_writes
from .test_trainjob_controller import OFFLINE_STAGES, jobs, slow_offline, stage_job_writes

pytestmark = pytest.mark.cluster
WATCH_RESTARTED = "Restarting the watch-stream"  # kopf's line when a watch gets 410 Gone


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kopf_log() -> Iterator[Lines]:
    """Everything kopf logs, its watcher's debug lines included, and the operator's own lines."""
    lines = Lines()
    watcher = logging.getLogger("kopf._cogs.clients.watching")
    old_level = watcher.level
    watcher.setLevel(logging.DEBUG)
    roots = [logging.getLogger("kopf"), logging.getLogger("speculator_operator")]
    for root in roots:
        root.addHandler(lines)
    yield lines
    for root in roots:
        root.removeHandler(lines)
    watcher.setLevel(old_level)


def tracebacks(lines: Lines) -> list[logging.LogRecord]:
    return [r for r in lines.records if r.exc_info and r.levelno >= logging.ERROR]


def names(cluster: Cluster, namespace: str, kinds: str) -> list[str]:
    out = cluster.kubectl("get", kinds, "-n", namespace, "-o", "name").stdout
    return sorted(out.split())


def test_an_api_server_restart_over_compacted_history_loses_no_transition(
    cluster: Cluster, operator_crds: list[str], store: dict[str, str], namespace: str, creds: str, kopf_log: Lines
) -> None:
    if cluster.harness is None:
        pytest.skip("needs the local control plane to stop and start its API server")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    with KopfRunner(args, timeout=120):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("steady", store, "good", creds))
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/steady", "--timeout=120s")
        before = get(cluster, namespace, "sdep/steady")["status"]["revision"]
        # a change in flight: a new revision asked for, and at once the API server goes away
        patch = {"spec": {"serving": {"maxNumSeqs": 64}}}
        cluster.kubectl("patch", "-n", namespace, "sdep/steady", "--type=merge", "-p", json.dumps(patch))
        # a write the operator does not watch moves etcd past every resource version it has seen
        cluster.kubectl("create", "configmap", "-n", namespace, "advance")  # gone with the namespace
        compacted = cluster.harness.restart_apiserver(down_seconds=5, compact=True)
        assert compacted is not None

        def converged() -> dict[str, Any]:
            body = get(cluster, namespace, "sdep/steady")
            st = body.get("status") or {}
            assert st.get("observedGeneration") == body["metadata"]["generation"], st.get("observedGeneration")
            assert st.get("revision") not in (None, before), st.get("revision")
            assert st.get("phase") == "Ready", st.get("phase")
            return st

        st = eventually(converged, timeout=180, interval=1)
        template = get(cluster, namespace, "deployment/steady")["spec"]["template"]
        assert template["metadata"]["labels"]["speculators.dev/revision"] == st["revision"]
        args_ = template["spec"]["containers"][0]["args"]
        assert args_[args_.index("--max-num-seqs") + 1] == "64"
        # each child once: one Deployment, Service and PDB; two ReplicaSets (the old revision and the new)
        assert names(cluster, namespace, "deployments") == ["deployment.apps/steady"]
        assert names(cluster, namespace, "services") == ["service/steady"]
        assert names(cluster, namespace, "poddisruptionbudgets") == ["poddisruptionbudget.policy/steady"]
        assert len(names(cluster, namespace, "replicasets")) == 2
        # events are best effort (one posted while the API server was away is lost), but none names a third
        events = [e for e in get(cluster, namespace, "events")["items"] if e.get("reason") == "RollingOut"]
        assert {e["message"] for e in events} <= {f"applying revision {r}" for r in (before, st["revision"])}
    restarted = [r.getMessage() for r in kopf_log.records if WATCH_RESTARTED in r.getMessage()]
    assert restarted, "no watch saw 410 Gone: the compaction did not reach the operator's resource versions"
    errors = tracebacks(kopf_log)
    print(f"watch streams restarted after 410 Gone: {len(restarted)}; error records with a traceback: {len(errors)}")
    for r in errors[:5]:
        print(" ", r.name, r.getMessage()[:200])
    assert errors == [], [f"{r.name}: {r.getMessage()[:200]}" for r in errors]


def test_an_api_server_restart_between_train_job_stages_loses_no_stage(
    cluster: Cluster,
    operator_crds: list[str],
    store: dict[str, str],
    namespace: str,
    creds: str,
    workspace: Any,
    kopf_log: Lines,
) -> None:
    if cluster.harness is None or cluster.local is None or cluster.local.audit_log is None:
        pytest.skip("needs the local control plane to restart its API server, and its audit log")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    workspace("faults-workspace")
    manifest = slow_offline("faults", store, creds, "3s")
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    start = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with KopfRunner(args, timeout=120) as runner:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
        # the run between stages: prepare's Job made, and it finishes while the API server is away
        eventually(lambda: _has(jobs(cluster, namespace, "faults"), "prepare"), timeout=120, interval=0.2)
        assert cluster.harness.restart_apiserver(down_seconds=5, compact=False) is None
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "stj/faults", "--timeout=240s")
    assert runner.exception is None, runner.exception
    st = get(cluster, namespace, "stj/faults")["status"]
    assert [s["phase"] for s in st["stages"]] == ["Succeeded"] * len(OFFLINE_STAGES)
    stage_job_writes(operator_writes(cluster.local.audit_log, start), "faults")
    said = [r.getMessage() for r in kopf_log.records if r.levelno >= logging.WARNING]
    errors = tracebacks(kopf_log)
    print(f"warning lines during the outage: {len(said)}; error records with a traceback: {len(errors)}")
    for line in said[:10]:
        print(" ", line[:200])
    assert errors == [], [f"{r.name}: {r.getMessage()[:200]}" for r in errors]
    assert any("will retry" in line for line in said), said  # kopf's line for each watch it reconnects


def _has(found: dict[str, Any], stage: str) -> None:
    assert stage in found, sorted(found)
