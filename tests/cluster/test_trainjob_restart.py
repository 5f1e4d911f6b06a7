"""The operator stopped at every stage of a SpeculatorTrainJob, while the stage's Job finishes without it,
resumes on restart: every Job is created exactly once (API writes counted in the API server's audit
log) and the run still succeeds. Its own module, so that no other operator instance is running."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import pytest
from kopf.testing import KopfRunner

from .conftest import Cluster, eventually, get
from .test_deployment_restart import operator_writes
from .test_trainjob_controller import OFFLINE_STAGES, jobs, listed, slow_offline, stage_job_writes

pytestmark = pytest.mark.cluster


def test_restart_at_every_stage_resumes_without_duplicates(
    cluster: Cluster, operator_crds: list[str], store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    if cluster.local is None or cluster.local.audit_log is None:
        pytest.skip("needs the local control plane's audit log to count API requests")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    workspace("resume-workspace")
    manifest = slow_offline("resume", store, creds, "2s")
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    start = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    order = OFFLINE_STAGES
    stopped_at = []
    for stage in order:
        with KopfRunner(args, timeout=60) as runner:

            def created(stage: str = stage) -> None:
                assert stage in jobs(cluster, namespace, "resume"), stage

            eventually(created, timeout=60, interval=0.2)
        assert runner.exception is None, runner.exception
        stopped_at.append(stage)

        # the stage finishes while no operator runs
        def finished(stage: str = stage) -> None:
            status = jobs(cluster, namespace, "resume")[stage].get("status", {})
            assert status.get("succeeded"), status

        eventually(finished, timeout=60, interval=0.2)

    with KopfRunner(args, timeout=60) as runner:
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "stj/resume", "--timeout=120s")
    assert runner.exception is None, runner.exception
    assert stopped_at == order
    st = get(cluster, namespace, "stj/resume")["status"]
    assert st["phase"] == "Succeeded"
    assert [s["phase"] for s in st["stages"]] == ["Succeeded"] * len(order)

    writes = operator_writes(cluster.local.audit_log, start)
    stage_job_writes(writes, "resume")
    assert sorted(jobs(cluster, namespace, "resume")) == sorted(order)
    assert sum(1 for w in writes if w == "patch deployments//resume-extractor") == 1
    assert listed(cluster, namespace, "deployments", "speculators.dev/trainjob=resume") == []
