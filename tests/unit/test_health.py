"""The kstatus conditions (Reconciling / Stalled) derived from a status, one case per row of the GitOps table
(docs/operations/gitops.md); tests/cluster/test_gitops.py runs the real kstatus and Argo CD scripts on live objects."""

from __future__ import annotations

from typing import Any

import pytest

from speculator_operator.api.common import conditions_of
from speculator_operator.api.deployment import SpeculatorDeploymentStatus
from speculator_operator.api.trainjob import SpeculatorTrainJobStatus
from speculator_operator.planning.health import Health, deployment_health, trainjob_health

from ..clock import NOW


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message or reason, "observedGeneration": 2}


def sdep(phase: str, *conds: dict[str, Any], **fields: Any) -> SpeculatorDeploymentStatus:
    return SpeculatorDeploymentStatus.model_validate({"phase": phase, "observedGeneration": 2,
                                                      "conditions": list(conds), **fields})  # fmt: skip


def stj(phase: str, *conds: dict[str, Any], **fields: Any) -> SpeculatorTrainJobStatus:
    return SpeculatorTrainJobStatus.model_validate({"phase": phase, "observedGeneration": 2,
                                                    "conditions": list(conds), **fields})  # fmt: skip


def verdict(status: SpeculatorDeploymentStatus | SpeculatorTrainJobStatus) -> tuple[str, str] | None:
    """(the kstatus condition that is True, its reason), or None when neither is."""
    derived = (
        deployment_health(status, now=NOW)
        if isinstance(status, SpeculatorDeploymentStatus)
        else trainjob_health(status, now=NOW)
    )
    true = [c for c in derived.conditions if c.type in set(Health) and c.status == "True"]
    assert len(true) <= 1, true  # never both
    assert not [c for c in derived.conditions if c.type in set(Health) and c.status != "True"]  # the other: gone
    return (true[0].type, true[0].reason) if true else None


READY = cond("Ready", "True", "Ready")
SERVING = cond("Serving", "True", "RolledOut")
PASSED = cond("Audited", "True", "AuditPassed")
RETRAINING = {"retrain": {"job": "q-retrain-abc", "verifierRevision": "new"}}

DEPLOYMENT_ROWS = [
    (
        "pending on an unreadable input",
        sdep(
            "Pending", cond("Audited", "Unknown", "CheckpointUnreadable"), cond("Ready", "Unknown", "WaitingForInputs")
        ),
        ("Reconciling", "CheckpointUnreadable"),
    ),
    (
        "pending on a train job",
        sdep("Pending", cond("Audited", "Unknown", "TrainJobPending"), cond("Ready", "Unknown", "WaitingForInputs")),
        ("Reconciling", "TrainJobPending"),
    ),
    (
        "an input unreadable while the last pair serves",
        sdep(
            "Degraded", cond("Audited", "Unknown", "CheckpointUnreadable"), cond("Ready", "Unknown", "WaitingForInputs")
        ),
        ("Reconciling", "CheckpointUnreadable"),
    ),
    (
        "rolling out",
        sdep("Deploying", PASSED, cond("Serving", "False", "RollingOut"), cond("Ready", "False", "RollingOut")),
        ("Reconciling", "RollingOut"),
    ),
    ("ready", sdep("Ready", PASSED, SERVING, READY), None),
    (
        "degraded: a new verifier refused the draft",
        sdep(
            "Degraded",
            cond("Audited", "False", "AuditFailed"),
            cond("Ready", "False", "AuditFailed", "1 audit error(s); first: fc-shape"),
        ),
        ("Stalled", "AuditFailed"),
    ),
    (
        "audit failed",
        sdep("Failed", cond("Audited", "False", "AuditFailed"), cond("Ready", "False", "AuditFailed")),
        ("Stalled", "AuditFailed"),
    ),
    (
        "release unsupported",
        sdep("Failed", cond("Ready", "False", "ReleaseUnsupported")),
        ("Stalled", "ReleaseUnsupported"),
    ),
    ("invalid spec", sdep("Failed", cond("Ready", "False", "InvalidSpec")), ("Stalled", "InvalidSpec")),
    (
        "a train job that failed",
        sdep("Pending", cond("Audited", "Unknown", "TrainJobFailed"), cond("Ready", "Unknown", "WaitingForInputs")),
        ("Stalled", "TrainJobFailed"),
    ),
    (
        "retrain unavailable",
        sdep("Ready", PASSED, SERVING, READY, cond("VerifierCurrent", "False", "RetrainUnavailable")),
        ("Stalled", "RetrainUnavailable"),
    ),
    (
        "rollout past its deadline",
        sdep(
            "Deploying",
            PASSED,
            cond("Serving", "False", "ProgressDeadlineExceeded"),
            cond("Ready", "False", "RollingOut"),
        ),
        ("Stalled", "ProgressDeadlineExceeded"),
    ),
    (
        "an image the node cannot pull",
        sdep("Deploying", PASSED, cond("Serving", "False", "ImagePullBackOff"), cond("Ready", "False", "RollingOut")),
        ("Stalled", "ImagePullBackOff"),
    ),
    (
        "a server that finds no accelerator",
        sdep("Deploying", PASSED, cond("Serving", "False", "NoAccelerator"), cond("Ready", "False", "RollingOut")),
        ("Stalled", "NoAccelerator"),
    ),
    (
        "a server that refused its staged draft",
        sdep("Deploying", PASSED, cond("Serving", "False", "DraftAuditFailed"), cond("Ready", "False", "RollingOut")),
        ("Stalled", "DraftAuditFailed"),
    ),
    (
        "a server whose engine exited (retried: the progress deadline decides)",
        sdep("Deploying", PASSED, cond("Serving", "False", "EngineExited"), cond("Ready", "False", "RollingOut")),
        ("Reconciling", "EngineExited"),
    ),
    (
        "a crash loop (the progress deadline decides)",
        sdep("Deploying", PASSED, cond("Serving", "False", "CrashLoopBackOff"), cond("Ready", "False", "RollingOut")),
        ("Reconciling", "CrashLoopBackOff"),
    ),
    (
        "verifier change paused",
        sdep("Ready", PASSED, SERVING, READY, cond("VerifierCurrent", "False", "VerifierChanged")),
        None,
    ),
    ("draft change paused", sdep("Ready", PASSED, SERVING, READY, cond("DraftCurrent", "False", "DraftChanged")), None),
    (
        "retraining while the pair serves",
        sdep("Ready", PASSED, SERVING, READY, cond("VerifierCurrent", "False", "Retraining"), **RETRAINING),
        None,
    ),
    (
        "retraining after the new verifier refused the draft",
        sdep(
            "Degraded",
            cond("Audited", "False", "AuditFailed"),
            cond("Ready", "False", "AuditFailed"),
            cond("VerifierCurrent", "False", "Retraining"),
            **RETRAINING,
        ),
        ("Reconciling", "Retraining"),
    ),
    (
        "an apply the API server refused",
        sdep("Degraded", PASSED, cond("Ready", "False", "ApplyFailed")),
        ("Reconciling", "ApplyFailed"),
    ),
]


@pytest.mark.parametrize(("status", "expected"), [r[1:] for r in DEPLOYMENT_ROWS], ids=[r[0] for r in DEPLOYMENT_ROWS])
def test_a_deployment_says_reconciling_or_stalled_as_the_gitops_table_has_it(
    status: SpeculatorDeploymentStatus, expected: tuple[str, str] | None
) -> None:
    assert verdict(status) == expected


STARTED = [
    {"name": "fetch", "phase": "Succeeded", "job": "q-fetch", "startTime": "2026-12-05T10:00:00Z"},
    {"name": "prepare", "phase": "Running", "job": "q-prepare", "startTime": "2026-12-05T10:01:00Z"},
]
TRAINJOB_ROWS = [
    (
        "pending on its verifier",
        stj("Pending", cond("Ready", "False", "VerifierUnreadable")),
        ("Reconciling", "VerifierUnreadable"),
    ),
    (
        "its first stage's Job not started",
        stj(
            "Preparing",
            cond("Failed", "False", "Running"),
            stages=[{"name": "fetch", "phase": "Pending", "job": "q-fetch"}],
        ),
        ("Reconciling", "Running"),
    ),
    ("a stage running", stj("Preparing", cond("Failed", "False", "Running"), stages=STARTED), None),
    (
        "waiting for a server mid-run",
        stj("Extracting", cond("Failed", "False", "WaitingForServer"), stages=STARTED),
        None,
    ),
    (
        "a stage pod that cannot get its image",
        stj("Preparing", cond("Failed", "False", "ErrImagePull"), stages=STARTED),
        ("Stalled", "ErrImagePull"),
    ),
    (
        "succeeded",
        stj("Succeeded", cond("Ready", "True", "Succeeded"), cond("Failed", "False", "Succeeded"), stages=STARTED),
        None,
    ),
    (
        "failed",
        stj(
            "Failed",
            cond("Ready", "False", "StageFailed"),
            cond("Failed", "True", "AcceptanceBelowThreshold"),
            stages=STARTED,
        ),
        ("Stalled", "AcceptanceBelowThreshold"),
    ),
]


@pytest.mark.parametrize(("status", "expected"), [r[1:] for r in TRAINJOB_ROWS], ids=[r[0] for r in TRAINJOB_ROWS])
def test_a_train_job_says_reconciling_or_stalled_as_the_gitops_table_has_it(
    status: SpeculatorTrainJobStatus, expected: tuple[str, str] | None
) -> None:
    assert verdict(status) == expected


def test_the_kstatus_conditions_cost_no_write_of_their_own() -> None:
    rolling = sdep("Deploying", PASSED, cond("Serving", "False", "RollingOut"), cond("Ready", "False", "RollingOut"))
    once = deployment_health(rolling, now=NOW)
    reconciling = conditions_of(once)["Reconciling"]
    assert reconciling.observed_generation == 2
    # derived again from the same status: the same object, nothing to write
    assert deployment_health(once, now=NOW) is once
    # settled: a Reconciling written by an earlier pass goes
    settled = deployment_health(
        sdep("Ready", PASSED, SERVING, READY, cond("Reconciling", "True", "RollingOut")), now=NOW
    )
    assert "Reconciling" not in conditions_of(settled)
    assert deployment_health(settled, now=NOW) is settled


def test_a_stall_keeps_its_transition_time_while_it_lasts() -> None:
    failed = sdep("Failed", cond("Ready", "False", "InvalidSpec"))
    first = deployment_health(failed, now=NOW)
    stall = conditions_of(first)["Stalled"]
    later = deployment_health(
        first.model_copy(update={"conditions": [*first.conditions[:-1], stall.model_copy(update={"message": "new"})]}),
        now=NOW,
    )
    assert conditions_of(later)["Stalled"].last_transition_time == stall.last_transition_time


def test_a_child_past_its_progress_deadline_is_a_stuck_rollout() -> None:
    from speculator_operator.api.deployment import SpeculatorDeploymentSpec
    from speculator_operator.api.labels import REVISION_LABEL
    from speculator_operator.planning.deployment import serving_status

    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://org/draft"}, "serving": {"replicas": 1}}
    )
    deadline = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "q-5d41" has timed out progressing.'}  # fmt: skip
    counts = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1}
    child = {"metadata": {"generation": 1, "annotations": {REVISION_LABEL: "r1"}},
             "status": {**counts, "conditions": [deadline]}}  # fmt: skip
    crashing = [{"name": "vllm", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    pod = {"metadata": {"name": "q-1", "labels": {REVISION_LABEL: "r1"}}, "status": {"containerStatuses": crashing}}
    stuck = serving_status(spec, "r1", child, [pod])
    assert stuck.reason == "ProgressDeadlineExceeded"
    assert "timed out progressing" in stuck.problem
    assert "CrashLoopBackOff" in stuck.problem
    rolling = serving_status(spec, "r1", {**child, "status": {**child["status"], "conditions": []}}, [pod])
    assert rolling.reason == "CrashLoopBackOff"  # before the deadline: the pod's own reason, not a stall
