"""The sweep stages in the train job's stage machine, without a cluster: one server lifetime per K after the gate (the
evaluation server kept for the evaluated K, then ⌈K/2⌉, then plain), the curve assembled from the three reports into
status.evaluation and the published record, a failed point named, a server never ready failing after the sweep's
timeout and staying failed. Real vLLM runs the client in tests/workloads/test_evaluate.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.sweep import Curve

from .test_reconcile_trainjob import MEASURED, SPEC, evaluator, job, kinds, observed, run

SWEEP = SpeculatorTrainJobSpec.model_validate(
    {
        **SPEC.model_dump(by_alias=True, exclude_none=True),
        "evaluation": {"heldOut": 6, "timeoutSeconds": 600, "sweep": {"maxConcurrency": 8, "timeoutSeconds": 900}},
    }
)
BEFORE = ["fetch", "prepare", "extract", "train", "audit", "evaluate"]
SWEEPS = ["sweep-k", "sweep-half", "sweep-plain"]


def server(role: str, available: bool = True, created: str = "2026-11-29T10:00:00Z") -> dict[str, Any]:
    found = evaluator(available, created)
    return {**found, "metadata": {**found["metadata"], "name": f"q-{role}"}}


def part(k: int, device: str = "NVIDIA H100 80GB HBM3", rate: float = 100.0) -> dict[str, Any]:
    """One sweep stage's report: concurrencies 1, 2, 4 (6 held-out prompts)."""
    points = [{"k": k, "c": c, "n": 2 * c, "tokens": 128 * c, "s": 128 * c / (rate * c), "itlMs": 10.0}
              for c in (1, 2, 4)]  # fmt: skip
    return {"sweep": {"label": "x", "k": k, "device": device, "points": points}}


def test_the_sweep_runs_each_k_on_its_own_server_one_at_a_time_after_the_gate() -> None:
    jobs = {s: job("done") for s in BEFORE}
    reports = {"evaluate": {"evaluation": MEASURED}}  # K = 3
    p = run(observed(jobs=jobs, reports=reports, servers={"evaluator": server("evaluator")}), SWEEP)
    assert [s["name"] for s in p.status["stages"]] == [*BEFORE, *SWEEPS, "publish"]
    assert p.status["phase"] == "Sweeping"
    assert p.delete == []  # sweep-k measures the evaluated K on the evaluation server itself: it stays
    (client,) = [c for c in p.apply if c["kind"] == "Job"]
    args = client["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--label") + 1] == "k"
    assert args[args.index("--concurrencies") + 1] == "1,2,4"  # never above the 6 held-out prompts
    assert client["spec"]["activeDeadlineSeconds"] == 900
    # the next K: the evaluation server goes, the half-K server comes, and the client waits for it
    jobs["sweep-k"] = job("done")
    reports["sweep-k"] = part(3)
    p = run(observed(jobs=jobs, reports=reports, servers={"evaluator": server("evaluator")}), SWEEP)
    assert ("apps/v1", "Deployment", "q-evaluator") in p.delete
    assert kinds(p) == [("Deployment", "q-sweeper-half"), ("Service", "q-sweeper-half")]
    (deployment, _) = p.apply
    command = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--half-k" in command
    assert command[command.index("--device-file") + 1] == "/workspace/sweep/sweeper-half.device.json"
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert (failed["status"], failed["reason"]) == ("False", "WaitingForServer")


def test_a_k_of_one_has_no_half_stage() -> None:
    jobs = {s: job("done") for s in BEFORE}
    p = run(observed(jobs=jobs, reports={"evaluate": {"evaluation": {**MEASURED, "k": 1}}}), SWEEP)
    assert [s["name"] for s in p.status["stages"]][-3:] == ["sweep-k", "sweep-plain", "publish"]


def test_the_whole_curve_goes_into_the_published_record_and_its_summary_into_status() -> None:
    jobs = {s: job("done") for s in [*BEFORE, *SWEEPS]}
    reports = {"evaluate": {"evaluation": MEASURED}, "sweep-k": part(3, rate=150.0), "sweep-half": part(2, rate=120.0),
               "sweep-plain": part(0, rate=100.0)}  # fmt: skip
    p = run(observed(jobs=jobs, reports=reports), SWEEP)
    assert p.status["stage"] == "publish"
    summary = p.status["evaluation"]["sweep"]
    assert summary["device"] == "nvidia-h100-80gb-hbm3"
    assert summary["ks"] == [3, 2]
    assert [b["bestK"] for b in summary["best"]] == [3, 3, 3]
    assert summary["best"][0]["speedup"] == 1.5
    assert "crossover" not in summary  # plain decoding never caught up
    (publish,) = [c for c in p.apply if c["kind"] == "Job"]
    args = publish["spec"]["template"]["spec"]["containers"][0]["args"]
    curve = Curve.from_wire(json.loads(args[args.index("--sweep") + 1]))
    assert curve.digest() == summary["digest"]  # the publish checks the curve against this digest
    assert len(curve.points) == 9
    assert json.loads(args[args.index("--evaluation") + 1])["sweep"] == summary


def test_points_that_do_not_make_one_curve_fail_the_run() -> None:
    jobs = {s: job("done") for s in [*BEFORE, *SWEEPS]}
    reports = {"evaluate": {"evaluation": MEASURED}, "sweep-k": part(3), "sweep-half": part(2),
               "sweep-plain": part(0, device="cpu")}  # fmt: skip
    p = run(observed(jobs=jobs, reports=reports), SWEEP)
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert (p.status["phase"], failed["reason"]) == ("Failed", "SweepFailed")
    assert "two devices" in failed["message"]
    assert p.apply == []


def test_a_failed_point_fails_the_stage_naming_it_and_nothing_is_published() -> None:
    jobs = {s: job("done") for s in [*BEFORE, "sweep-k"]} | {"sweep-half": job("failed")}
    before = part(2)["sweep"]["points"][:2]
    left = {"speculatorsReport": 1, "stage": "sweep", "message": "sweep at K=2, concurrency 4: connection refused",
            "sweep": {"k": 2, "failedAt": {"k": 2, "concurrency": 4}, "points": before}}  # fmt: skip
    reports = {"evaluate": {"evaluation": MEASURED}, "sweep-k": part(3)}
    p = run(observed(jobs=jobs, reports=reports, failed_reports={"sweep-half": left},
                     servers={"sweeper-half": server("sweeper-half")}), SWEEP)  # fmt: skip
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert (p.status["phase"], failed["reason"]) == ("Failed", "SweepFailed")
    assert "reached K=2, concurrency 4" in failed["message"]
    assert "nothing was published" in failed["message"]
    assert p.status["evaluation"]["sweep"] == {"failedAt": {"k": 2, "concurrency": 4}}
    assert ("apps/v1", "Deployment", "q-sweeper-half") in p.delete
    assert p.apply == []


def test_a_sweep_server_never_ready_fails_after_the_sweeps_timeout_and_stays_failed() -> None:
    jobs = {s: job("done") for s in [*BEFORE, "sweep-k"]}
    reports = {"evaluate": {"evaluation": MEASURED}, "sweep-k": part(3)}
    servers = {"sweeper-half": server("sweeper-half", available=False)}
    within = datetime(2026, 11, 29, 10, 14, 0, tzinfo=UTC)
    p = run(observed(jobs=jobs, reports=reports, servers=servers), SWEEP, now=within)
    assert p.status["phase"] == "Sweeping"
    late = datetime(2026, 11, 29, 10, 15, 1, tzinfo=UTC)
    p = run(observed(jobs=jobs, reports=reports, servers=servers), SWEEP, now=late)
    failed = {c["type"]: c for c in p.status["conditions"]}["Failed"]
    assert (p.status["phase"], failed["reason"]) == ("Failed", "SweepFailed")
    assert "(evaluation.sweep.timeoutSeconds 900)" in failed["message"]
    assert ("apps/v1", "Deployment", "q-sweeper-half") in p.delete
    # its server gone, the next pass does not start it again
    again = run(observed(status=p.status, jobs=jobs, reports=reports), SWEEP, now=late)
    assert again.apply == []
    assert again.status == p.status  # nothing to write
    assert again.events == []


def test_no_server_shares_a_stage_name() -> None:
    """A server's role and a stage's name are both a pod's speculators.dev/stage label (and `NAME-<it>` names both a
    Job and a Deployment): were they equal, a server's Service would select its own client's pod."""
    from speculator_operator.domain.releases import get_release
    from speculator_operator.render.training import SERVER_ROLES, Inputs, stages

    spec = SpeculatorTrainJobSpec.model_validate(
        {**SWEEP.model_dump(by_alias=True, exclude_none=True), "data": {**SPEC.model_dump(by_alias=True)["data"],
                                                                        "regenerate": {"dataset": "ultrachat"}}}
    )  # fmt: skip
    names = {s.name for s in stages(Inputs("q", "ml", spec, get_release(), "r", 36))}
    assert {"sweep-half", "sweep-plain", "regenerate", "extract", "evaluate"} <= names
    assert names.isdisjoint(SERVER_ROLES)
