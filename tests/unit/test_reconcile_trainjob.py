"""The SpeculatorTrainJob stage machine, without a cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from speculator_operator.api.common import stored
from speculator_operator.api.podcontract import StageReport
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec, SpeculatorTrainJobStatus
from speculator_operator.domain.releases import get_release, release_row
from speculator_operator.planning.trainjob import (
    Observed,
    handoff_offer,
    job_state,
    plan,
    resync_due,
    wakes_owner,
)

from ..clock import NOW

SPEC = SpeculatorTrainJobSpec.model_validate({
    "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "eagle3",
    "data": {"sources": ["hf:org/chats"], "format": "pretokenized"}, "output": {"uri": "s3://drafts/q"},
    "deployTo": "qwen",
})  # fmt: skip
ORDER = ["fetch", "prepare", "extract", "train", "audit", "publish"]


def job(state: str, failed: int = 0) -> dict[str, Any]:
    conds = {"done": [{"type": "Complete", "status": "True"}],
             "failed": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                         "message": "Job has reached the specified backoff limit"}],
             "running": []}[state]  # fmt: skip
    return {"status": {"conditions": conds, "startTime": "2026-11-29T10:00:00Z", "failed": failed or None,
                       "completionTime": "2026-11-29T10:01:00Z" if state == "done" else None}}  # fmt: skip


def observed(**kw: Any) -> Observed:
    kw["reports"] = {stage: StageReport.model_validate(r) for stage, r in kw.get("reports", {}).items()}
    kw["failed_reports"] = {s: StageReport.model_validate(r) for s, r in kw.get("failed_reports", {}).items()}
    return Observed(generation=1, status=S(kw.pop("status", {})), verifier_layers=36, verifier_revision="sha1",
                    verifier_model_type="qwen3", **kw)  # fmt: skip


def S(raw: dict[str, Any]) -> SpeculatorTrainJobStatus:
    """A stored status as the pass gives it to the planner."""
    return SpeculatorTrainJobStatus.model_validate(raw)


def run(obs: Observed, spec: SpeculatorTrainJobSpec = SPEC, now: datetime = NOW) -> Any:
    """The plan at `now`, its status as the pass writes it (the wire form the API server stores: what these tests
    read)."""
    p = plan("q", "ml", "uid", spec, get_release(), obs, now=now)
    return SimpleNamespace(**{**vars(p), "status": stored(p.status)})


def kinds(p: Any) -> list[tuple[str, str]]:
    return [(c["kind"], c["metadata"]["name"]) for c in p.apply]


def test_a_new_job_starts_with_the_workspace_and_the_fetch_stage() -> None:
    p = run(observed())
    assert kinds(p) == [("PersistentVolumeClaim", "q-workspace"), ("Job", "q-fetch")]
    assert p.status["phase"] == "Preparing"
    assert p.status["stage"] == "fetch"
    assert [s["phase"] for s in p.status["stages"]] == ["Pending"] * len(ORDER)
    assert p.events == [("Normal", "StageStarted", "stage fetch")]


def test_the_next_stage_follows_the_last_success_and_existing_jobs_are_not_reapplied() -> None:
    p = run(observed(jobs={"fetch": job("done"), "prepare": job("running")}))
    assert p.status["stage"] == "prepare"
    assert p.status["phase"] == "Preparing"
    assert ("Job", "q-prepare") not in kinds(p)  # exists: its template is immutable
    # the workspace was applied with the first Job and cannot change: not applied (nor read) again
    assert ("PersistentVolumeClaim", "q-workspace") not in kinds(p)
    waiting = run(observed(servers={"extractor": {"metadata": {"name": "q-extractor"}}}))
    assert ("PersistentVolumeClaim", "q-workspace") in kinds(waiting)  # no Job yet: still applied
    assert [s["phase"] for s in p.status["stages"]][:2] == ["Succeeded", "Running"]


def test_a_client_stage_waits_for_its_server() -> None:
    done = {s: job("done") for s in ORDER[:2]}
    p = run(observed(jobs=done))
    assert kinds(p) == [("Deployment", "q-extractor"), ("Service", "q-extractor")]  # the workspace: with the first Job
    conds = {c["type"]: c for c in p.status["conditions"]}
    assert conds["Failed"]["status"] == "False"
    assert conds["Failed"]["reason"] == "WaitingForServer"
    assert "Ready" not in conds  # a started run has no Ready until it ends (kstatus: Current, as a started Job)
    up = {"metadata": {"name": "q-extractor", "generation": 1}, "spec": {"replicas": 1},
          "status": {"observedGeneration": 1, "availableReplicas": 1}}  # fmt: skip
    p = run(observed(jobs=done, servers={"extractor": up}))
    assert ("Job", "q-extract") in kinds(p)
    # once extraction is done the server goes: it holds GPUs
    p = run(observed(jobs={s: job("done") for s in ORDER[:3]}, servers={"extractor": up}))
    assert ("apps/v1", "Deployment", "q-extractor") in p.delete
    assert p.status["stage"] == "train"


def test_a_failed_stage_fails_the_run_with_its_log_tail_and_nothing_later_runs() -> None:
    jobs = {s: job("done") for s in ORDER[:3]} | {"train": job("failed", failed=3)}
    p = run(observed(jobs=jobs, failures={"train": "CUDA error: out of memory\n"}))
    assert p.status["phase"] == "Failed"
    assert p.status["stage"] == "train"
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert failed["status"] == "True"
    assert failed["reason"] == "StageFailed"
    assert "BackoffLimitExceeded" in failed["message"]
    assert "CUDA error: out of memory" in failed["message"]
    assert p.apply == []
    assert p.handoff is None
    assert next(s for s in p.status["stages"] if s["name"] == "train")["failures"] == 3


def test_an_audit_failure_is_named_as_such() -> None:
    jobs = {s: job("done") for s in ORDER[:4]} | {"audit": job("failed")}
    p = run(observed(jobs=jobs, failures={"audit": "audit failed: 1 error(s); first: fc-shape: ..."}))
    conds = {c["type"]: c for c in p.status["conditions"]}
    assert conds["Failed"]["reason"] == "AuditFailed"
    assert conds["Audited"]["status"] == "False"


def test_success_reports_the_checkpoint_and_hands_it_off() -> None:
    reports = {"publish": {"uri": None, "digest": "sha256:ab"}, "prepare": {"samples": 10, "fingerprint": "f"},
               "audit": {"audit": {"ok": True, "errors": 0, "warnings": 0, "findings": []}}}  # fmt: skip
    reports["publish"].pop("uri")
    p = run(observed(jobs={s: job("done") for s in ORDER}, reports=reports))
    st = p.status
    assert st["phase"] == "Succeeded"
    assert "stage" not in st
    assert st["checkpoint"] == {"uri": "s3://drafts/q", "digest": "sha256:ab"}
    assert st["provenance"]["dataFingerprint"] == "f"
    assert st["progress"]["samplesTotal"] == 10
    assert p.handoff == ("qwen", "s3://drafts/q")
    # handed off already: a later pass changes nothing and hands nothing off
    again = run(observed(status={**st, "deployedTo": "qwen"}))
    assert again.apply == []
    assert again.handoff is None
    assert again.status == {**st, "deployedTo": "qwen"}


def test_mtp_needs_a_verifier_with_mtp_layers() -> None:
    spec = SpeculatorTrainJobSpec.model_validate({**SPEC.model_dump(by_alias=True, exclude_none=True),
                                                  "algorithm": "mtp"})  # fmt: skip
    obs = observed()
    obs.verifier_model_type = "llama"
    p = run(obs, spec)
    assert p.status["phase"] == "Failed"
    assert "native MTP layers" in p.status["conditions"][0]["message"]
    assert p.apply == []


def test_samples_longer_than_the_verifier_takes_are_refused() -> None:
    obs = observed()
    obs.verifier_max_positions = 4096  # SPEC keeps the default seqLength 8192
    p = run(obs)
    assert p.status["phase"] == "Failed"
    assert "exceeds the verifier's max_position_embeddings 4096" in p.status["conditions"][0]["message"]
    obs.verifier_max_positions = 40960
    assert run(obs).status["phase"] == "Preparing"


def test_a_verifier_whose_layers_contradict_the_declared_count_stops_the_job_before_any_stage() -> None:
    dumped = SPEC.model_dump(by_alias=True, exclude_none=True)
    spec = SpeculatorTrainJobSpec.model_validate({**dumped, "verifier": {**dumped["verifier"], "numHiddenLayers": 40}})
    p = run(observed(), spec)  # the verifier's config.json says 36
    assert p.status["phase"] == "Failed"
    failed = next(c for c in p.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "numHiddenLayers is 40" in failed["message"]
    assert "num_hidden_layers 36" in failed["message"]
    assert p.apply == []
    declared = {**dumped, "verifier": {**dumped["verifier"], "numHiddenLayers": 36}}
    assert run(observed(), SpeculatorTrainJobSpec.model_validate(declared)).status["phase"] == "Preparing"


def test_a_job_whose_release_cannot_serve_its_algorithm_is_refused_before_any_stage() -> None:
    """P-EAGLE trains with speculators, but vLLM 0.34 no longer serves it: neither the evaluate stage nor a
    deployment could load the result."""
    spec = SpeculatorTrainJobSpec.model_validate({**SPEC.model_dump(by_alias=True, exclude_none=True),
                                                  "algorithm": "peagle"})  # fmt: skip
    p = plan("q", "ml", "uid", spec, release_row("2026.12-vllm0.34"), observed(), now=NOW)
    failed = next(c for c in p.status.conditions if c.type == "Failed")
    assert (p.status.phase, failed.reason) == ("Failed", "InvalidSpec")
    assert "vLLM 0.34.0 removed peagle" in failed.message
    assert "name a release that serves peagle: 2026.11-vllm0.32" in failed.message  # the way out
    assert p.apply == []
    # 0.32 serves it
    assert plan("q", "ml", "uid", spec, get_release(), observed(), now=NOW).status.phase == "Preparing"


def test_unreadable_verifier_waits() -> None:
    p = run(Observed(generation=1, status=S({}), problem=("VerifierUnreadable", "s3://x: 403")))
    assert p.status["phase"] == "Pending"
    assert p.apply == []


def test_job_states_and_reports() -> None:
    assert job_state(None)[0] == "Pending"
    assert job_state(job("running"))[0] == "Running"
    assert job_state(job("failed"))[1]["reason"] == "BackoffLimitExceeded"
    found = StageReport.decode(json.dumps({"speculatorsReport": 1, "samples": 3}))
    assert found is not None
    assert found.model_dump(by_alias=True, exclude_none=True) == {"speculatorsReport": 1, "samples": 3}
    assert StageReport.decode("Traceback (most recent call last): ...") is None
    assert StageReport.decode(json.dumps({"samples": 3})) is None
    assert StageReport.decode("[1, 2]") is None


def test_a_failed_run_warns_once_and_goes_on_when_its_failed_job_is_deleted() -> None:
    jobs = {s: job("done") for s in ORDER[:3]} | {"train": job("failed", failed=3)}
    first = run(observed(jobs=jobs))
    assert [e[0] for e in first.events] == ["Warning"]
    again = run(observed(jobs=jobs, status=first.status))
    assert again.events == []
    assert again.status == first.status
    resumed = run(observed(jobs={s: job("done") for s in ORDER[:3]}, status=first.status))
    assert resumed.status["phase"] == "Training"
    assert "completionTime" not in resumed.status
    assert ("Job", "q-train") in kinds(resumed)
    assert resumed.events == [("Normal", "Resumed", "stage train runs again")]


def test_only_finished_jobs_available_servers_and_deletions_wake_the_owner() -> None:
    assert wakes_owner("MODIFIED", job("done"))
    assert wakes_owner("MODIFIED", job("failed"))
    assert not wakes_owner("MODIFIED", job("running"))
    assert wakes_owner("DELETED", job("running"))
    assert wakes_owner("MODIFIED", {"status": {"availableReplicas": 1}})
    assert not wakes_owner("ADDED", {"status": {"replicas": 1}})


def test_the_hand_off_offers_to_a_deployment_and_writes_no_spec() -> None:
    assert handoff_offer(None, "j", "qwen", "s3://d/x")[0] == "TargetMissing"
    follower = {"spec": {"speculator": {"fromTrainJob": "j"}}}
    assert handoff_offer(follower, "j", "qwen", "s3://d/x") == (
        "Following", "SpeculatorDeployment qwen serves this job's output (speculator.fromTrainJob)")  # fmt: skip
    reason, message = handoff_offer({"spec": {"speculator": {"source": "s3://d/old"}}}, "j", "qwen", "s3://d/x")
    assert reason == "Offered"
    assert "status.handedOver" in message


def test_the_exact_published_location_is_handed_off_and_retention_runs_once() -> None:
    spec = SpeculatorTrainJobSpec.model_validate(
        {**SPEC.model_dump(by_alias=True, exclude_none=True), "output": {"uri": "s3://drafts/q", "keepLatest": 2}}
    )
    exact = "s3://drafts/q/sha256-00d03ae54e2b0fb8"
    reports = {"publish": {"uri": exact, "digest": "sha256:00d03ae54e2b0fb8ff"}}
    p = run(observed(jobs={s: job("done") for s in ORDER}, reports=reports), spec)
    assert p.status["checkpoint"] == {"uri": exact, "digest": "sha256:00d03ae54e2b0fb8ff"}
    assert p.handoff == ("qwen", exact)
    assert p.prune == 2
    assert p.status["provenance"]["verifierRevision"] == "sha1"
    publish = next(s for s in p.status["provenance"]["commands"].items() if s[0] == "publish")[1]
    assert "--uri s3://drafts/q" in publish
    done = {**p.status, "deployedTo": "qwen"}
    assert resync_due(spec.model_dump(by_alias=True, exclude_none=True), done)  # keepLatest not applied yet
    assert run(observed(status=done), spec).prune == 2
    pruned = {**done, "retention": {"keepLatest": 2, "deleted": [], "kept": []}}
    assert run(observed(status=pruned), spec).prune is None
    assert not resync_due(spec.model_dump(by_alias=True, exclude_none=True), pruned)
    assert run(observed(jobs={s: job("done") for s in ORDER}, reports=reports)).prune is None  # not asked for


def test_a_stuck_stage_pod_is_named_in_the_status() -> None:
    obs = observed(jobs={"fetch": job("running")})
    obs.stuck["fetch"] = ("ErrImagePull", "pod q-fetch-x, container main: ErrImagePull: connection refused")
    p = run(obs)
    conds = {c["type"]: c for c in p.status["conditions"]}
    assert conds["Failed"]["reason"] == "ErrImagePull"
    assert "connection refused" in conds["Failed"]["message"]
    assert "ErrImagePull" in p.status["stages"][0]["message"]


CONVERT = SpeculatorTrainJobSpec.model_validate({
    "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "dflash", "output": {"uri": "s3://drafts/q"},
    "convert": {"source": "hf://z-lab/Qwen3-8B-DFlash-b16", "revision": "a1b2"},
})  # fmt: skip


def test_a_convert_job_runs_fetch_convert_audit_publish_and_records_its_source() -> None:
    p = run(observed(), CONVERT)
    assert [s["name"] for s in p.status["stages"]] == ["fetch", "convert", "audit", "publish"]
    p = run(observed(jobs={"fetch": job("done")}), CONVERT)
    assert ("Job", "q-convert") in kinds(p)
    assert p.status["phase"] == "Converting"
    assert not any(c["kind"] == "Deployment" for c in p.apply)  # no vLLM server for a conversion
    assert p.status["provenance"]["convertedFrom"] == "hf://z-lab/Qwen3-8B-DFlash-b16@a1b2"
    assert "convert" in p.status["provenance"]["commands"]
    assert "epochs" not in p.status.get("progress", {})


def test_a_failed_conversion_fails_the_run_naming_the_stage_and_the_converters_words() -> None:
    message = "ValueError: Unexpected keys in checkpoint -- the structure does not match DFlashDraftModel"
    p = run(observed(jobs={"fetch": job("done"), "convert": job("failed", 1)}, failures={"convert": message}), CONVERT)
    assert p.status["phase"] == "Failed"
    ready = {c["type"]: c for c in p.status["conditions"]}["Ready"]
    assert ready["reason"] == "StageFailed"
    assert "convert" in ready["message"]
    assert "Unexpected keys" in ready["message"]
    assert ("Job", "q-audit") not in kinds(p)
    assert ("Job", "q-publish") not in kinds(p)


def test_mtp_is_stitched_before_the_audit() -> None:
    spec = SpeculatorTrainJobSpec.model_validate({**SPEC.model_dump(by_alias=True, exclude_none=True),
                                                  "algorithm": "mtp"})  # fmt: skip
    obs = observed(jobs={s: job("done") for s in ("fetch", "prepare", "extract", "train")})
    obs.verifier_model_type = "qwen3_next"
    p = run(obs, spec)
    assert p.status["phase"] == "Stitching"
    assert ("Job", "q-stitch") in kinds(p)
    qwen3 = observed()  # speculators trains MTP layers for qwen3 too, but vLLM serves no qwen3 with mtp
    assert run(qwen3, spec).status["phase"] == "Failed"


EVALUATED = SpeculatorTrainJobSpec.model_validate(
    {**SPEC.model_dump(by_alias=True, exclude_none=True), "evaluation": {"minAcceptance": 0.5, "timeoutSeconds": 600}}
)
EVAL_ORDER = ["fetch", "prepare", "extract", "train", "audit", "evaluate", "publish"]
MEASURED = {
    "outcome": "Passed",
    "prompts": 16,
    "tokens": 1024,
    "k": 3,
    "drafts": 300,
    "rate": 0.71,
    "meanAcceptedLength": 3.1,
    "minAcceptance": 0.5,
}


def evaluator(available: bool, created: str = "2026-11-29T10:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {"name": "q-evaluator", "generation": 1, "creationTimestamp": created},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "availableReplicas": int(available)},
    }


def test_the_evaluate_stage_runs_between_audit_and_publish_against_its_server() -> None:
    done = {s: job("done") for s in EVAL_ORDER[:5]}
    p = run(observed(jobs=done), EVALUATED)
    assert [s["name"] for s in p.status["stages"]] == EVAL_ORDER
    assert p.status["phase"] == "Evaluating"
    assert kinds(p) == [("Deployment", "q-evaluator"), ("Service", "q-evaluator")]
    p = run(observed(jobs=done, servers={"evaluator": evaluator(True)}), EVALUATED)
    assert ("Job", "q-evaluate") in kinds(p)


def test_a_passed_evaluation_goes_into_the_status_and_the_published_record() -> None:
    jobs = {s: job("done") for s in EVAL_ORDER[:6]}
    p = run(observed(jobs=jobs, reports={"evaluate": {"evaluation": MEASURED}}), EVALUATED)
    assert p.status["stage"] == "publish"
    assert p.status["evaluation"] == MEASURED
    assert p.status["provenance"]["evaluation"] == MEASURED
    (publish,) = [c for c in p.apply if c["kind"] == "Job"]
    args = publish["spec"]["template"]["spec"]["containers"][0]["args"]
    assert json.loads(args[args.index("--evaluation") + 1]) == MEASURED


def test_a_draft_below_the_bound_fails_with_its_numbers_and_nothing_is_published() -> None:
    jobs = {s: job("done") for s in EVAL_ORDER[:5]} | {"evaluate": job("failed")}
    below = {**MEASURED, "outcome": "AcceptanceBelowThreshold", "rate": 0.02, "meanAcceptedLength": 1.06}
    report = {"speculatorsReport": 1, "stage": "evaluate", "evaluation": below}
    tail = "Error (exit code 3): " + json.dumps(report)
    p = run(observed(jobs=jobs, failures={"evaluate": tail}, failed_reports={"evaluate": report},
                     servers={"evaluator": evaluator(True)}), EVALUATED)  # fmt: skip
    assert p.status["phase"] == "Failed"
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert failed["reason"] == "AcceptanceBelowThreshold"
    assert "acceptance 0.02" in failed["message"]
    assert "minAcceptance 0.5" in failed["message"]
    assert "nothing was published" in failed["message"]
    assert p.status["evaluation"]["rate"] == 0.02
    assert "evaluation" not in p.status["provenance"]  # only a passed measure is recorded with a publish
    assert p.apply == []
    assert ("apps/v1", "Deployment", "q-evaluator") in p.delete  # the server holds GPUs: it goes


def test_zero_drafts_is_named_as_such() -> None:
    jobs = {s: job("done") for s in EVAL_ORDER[:5]} | {"evaluate": job("failed")}
    zero = {"outcome": "ZeroDrafts", "prompts": 16, "tokens": 1024, "drafts": 0}
    report = {"speculatorsReport": 1, "stage": "evaluate", "evaluation": zero}
    tail = "Error (exit code 4): " + json.dumps(report)
    p = run(observed(jobs=jobs, failures={"evaluate": tail}, failed_reports={"evaluate": report}), EVALUATED)
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert failed["reason"] == "ZeroDrafts"
    assert "served without speculation" in failed["message"]


def test_an_evaluation_server_that_never_becomes_ready_fails_after_the_timeout() -> None:

    done = {s: job("done") for s in EVAL_ORDER[:5]}
    within = datetime(2026, 11, 29, 10, 9, 0, tzinfo=UTC)  # 540 s after its creation: still waiting
    p = run(observed(jobs=done, servers={"evaluator": evaluator(False)}), EVALUATED, now=within)
    waiting = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForServer")
    late = datetime(2026, 11, 29, 10, 10, 1, tzinfo=UTC)
    p = run(observed(jobs=done, servers={"evaluator": evaluator(False)}), EVALUATED, now=late)
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert p.status["phase"] == "Failed"
    assert failed["reason"] == "EvaluationServerNotReady"
    assert "q-evaluator was not ready 601 s after it was created (evaluation.timeoutSeconds 600)" in failed["message"]
    # the failure as a field of its own, which a later pass decides on (never the condition's message)
    evaluation = {"outcome": "EvaluationServerNotReady", "serverWaitSeconds": 601, "timeoutSeconds": 600}
    assert p.status["evaluation"] == evaluation
    assert ("apps/v1", "Deployment", "q-evaluator") in p.delete
    assert not [c for c in p.apply if c["kind"] == "Job"]


def test_a_run_failed_for_its_evaluation_server_stays_failed_until_its_spec_changes() -> None:

    done = {s: job("done") for s in EVAL_ORDER[:5]}
    late = datetime(2026, 11, 29, 10, 10, 1, tzinfo=UTC)
    failed = run(observed(jobs=done, servers={"evaluator": evaluator(False)}), EVALUATED, now=late)
    assert failed.status["phase"] == "Failed"
    # its server deleted, the next pass does not start it again: nothing applied, no second warning
    again = run(observed(status=failed.status, jobs=done), EVALUATED, now=late)
    assert again.status == failed.status  # nothing to write
    assert again.apply == []
    assert again.events == []
    # what holds it is the stored evaluation, not the words: a reworded message changes nothing
    conditions = [{**c, "message": "reworded"} for c in failed.status["conditions"]]
    reworded = run(observed(status={**failed.status, "conditions": conditions}, jobs=done), EVALUATED, now=late)
    assert reworded.status["phase"] == "Failed"
    assert reworded.apply == []
    said = {c["type"]: c for c in reworded.status["conditions"]}["Failed"]["message"]
    assert "not ready 601 s after it was created" in said  # said again from the fields
    # as fe501e0 stored it (no evaluation field, the reason on the Failed condition): still failed, not rerun
    older = {k: v for k, v in failed.status.items() if k != "evaluation"}
    taken = run(observed(status=older, jobs=done), EVALUATED, now=late)
    assert taken.status["phase"] == "Failed"
    assert taken.apply == []
    assert taken.status["evaluation"] == {"outcome": "EvaluationServerNotReady"}
    # a changed spec (a new generation) runs the stage again
    changed = Observed(
        generation=2,
        status=S(failed.status),
        verifier_layers=36,
        verifier_revision="sha1",
        verifier_model_type="qwen3",
        jobs=done,
    )
    resumed = run(changed, EVALUATED, now=late)
    assert ("Deployment", "q-evaluator") in kinds(resumed)
    assert resumed.status["phase"] == "Evaluating"


def test_the_provenance_keeps_the_image_each_stage_ran_after_its_pods_are_gone() -> None:
    ran = "ghcr.io/speculator-operator/trainer@sha256:" + "ab" * 32
    first = run(observed(jobs={s: job("done") for s in ORDER[:2]}, images={"fetch": ran, "prepare": ran}))
    assert first.status["provenance"]["images"] == {"fetch": ran, "prepare": ran}
    # a later pass that sees only the train pod (the earlier pods deleted) keeps what the earlier ones ran
    later = run(observed(status=first.status, jobs={s: job("done") for s in ORDER[:3]}, images={"train": ran}))
    assert later.status["provenance"]["images"] == {"fetch": ran, "prepare": ran, "train": ran}
