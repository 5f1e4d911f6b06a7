"""The pod contract (api/podcontract.py) through the real writers and the real readers on both sides: what a
stage pod writes is what the operator reads, for the stage report, the exit codes and outcomes, the progress
line and the environment."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.api import podcontract
from speculator_operator.api.podcontract import EvaluationOutcome, ExitCode, StageReport
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec, SpeculatorTrainJobStatus
from speculator_operator.domain.releases import get_release
from speculator_operator.planning import progress as operator_progress
from speculator_operator.planning.stagepods import observe_pods
from speculator_operator.planning.trainjob import Observed, evaluation_of
from speculator_operator.pods import evaluate, trainer
from speculator_operator.pods.progress import Tracker
from speculator_operator.render.training import Inputs, render_all
from speculator_operator.runtime.settings import Settings

# what each stage's entrypoint reports (trainer.run, fetch, audit, publish, evaluate), with the values it writes
REPORTS: dict[str, dict[str, Any]] = {
    "fetch": {"verifier": "/workspace/verifier", "revision": "abc", "dataFiles": 2,
              "converted": ""},
    "prepare": {"seconds": 12.5, "samples": 16, "heldOut": 4, "fingerprint": "f00d"},
    "extract": {"seconds": 3.0, "samples": 16},
    "train": {"seconds": 40.1, "epoch": 0},
    "convert": {"seconds": 1.2, "checkpoint": "/workspace/converted", "files": 3},
    "audit": {"checkpoint": "/workspace/checkpoints/2", "algorithm": "eagle3",
              "audit": {"ok": True, "errors": 0, "warnings": 1, "findings": [{"rule": "x", "severity": "warning"}]}},
    "publish": {"uri": "s3://drafts/q/sha256-ab", "digest": "sha256:ab"},
    "evaluate": {"evaluation": {"outcome": "Passed", "rate": 0.7}, "message": "acceptance 0.7 over 9 drafts"},
}  # fmt: skip


# what each stage's entrypoint reports, as the real writers make it below: the types the contract must take


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(podcontract.REPORT_PATH_ENV, str(path))
    return path


@pytest.mark.parametrize("stage", sorted(REPORTS))
def test_a_stage_report_reads_back_as_written(stage: str, termination_log: Path) -> None:
    trainer.report(stage, **REPORTS[stage], absent=None)
    message = termination_log.read_text()
    found = StageReport.decode(message)
    assert found is not None
    assert found.stage == stage
    assert found.model_dump(by_alias=True, exclude_none=True) == {"speculatorsReport": 1, "stage": stage,
                                                                  **REPORTS[stage]}  # fmt: skip
    assert found.encode() == message  # the operator's copy encodes to the pod's bytes


def test_the_operator_reads_a_report_from_the_pod_status_the_kubelet_writes(termination_log: Path) -> None:
    trainer.report("prepare", **REPORTS["prepare"])
    pod = {
        "metadata": {"labels": {"speculators.dev/stage": "prepare"}},
        "status": {"phase": "Succeeded", "containerStatuses": [{"name": "main", "state": {
            "terminated": {"exitCode": 0, "message": termination_log.read_text(), "finishedAt": "t"}}}]},
    }  # fmt: skip
    obs = Observed(generation=1, status=SpeculatorTrainJobStatus(), jobs={"prepare": {}})
    assert observe_pods(obs, [pod]) == {"prepare"}
    assert obs.reports["prepare"].samples == 16
    assert obs.reports["prepare"].fingerprint == "f00d"


def test_a_report_over_the_kubelets_limit_loses_findings_not_its_marker(termination_log: Path) -> None:
    findings = [{"rule": f"rule-{i}", "message": "x" * 200} for i in range(40)]
    trainer.report("audit", audit={"ok": False, "findings": findings})
    text = termination_log.read_text()
    assert len(text.encode()) <= podcontract.REPORT_LIMIT
    found = StageReport.decode(text)
    assert found is not None
    assert found.audit is not None
    assert 0 < len(found.audit["findings"]) < 40


EVALUATED = SpeculatorTrainJobSpec.model_validate({
    "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "eagle3",
    "data": {"sources": ["hf:HuggingFaceH4/ultrachat_200k"]}, "output": {"uri": "s3://drafts/q"},
    "evaluation": {"minAcceptance": 0.5, "heldOut": 8},
})  # fmt: skip


def test_each_failed_outcome_fails_the_job_at_once_and_names_the_condition(termination_log: Path) -> None:
    jobs = render_all(Inputs("q", "ml", EVALUATED, get_release(), "abc", 36, "uid"))
    (evaluate_job,) = [j for j in jobs if j["kind"] == "Job" and j["metadata"]["name"] == "q-evaluate"]
    rules = evaluate_job["spec"]["podFailurePolicy"]["rules"]
    fail_fast = next(r for r in rules if r["action"] == "FailJob")["onExitCodes"]["values"]
    measured = {"drafts": 0}
    outcome, _, code = evaluate.judge(measured, 0.5, None)
    assert (outcome, code) == (EvaluationOutcome.ZERO_DRAFTS, ExitCode.ZERO_DRAFTS)
    outcome, _, code = evaluate.judge({"drafts": 10, "rate": 0.1}, 0.5, None)
    assert (outcome, code) == (EvaluationOutcome.BELOW_THRESHOLD, ExitCode.BELOW_THRESHOLD)
    assert evaluate.judge({"drafts": 10, "rate": 0.9}, 0.5, None)[::2] == (EvaluationOutcome.PASSED, ExitCode.OK)
    for failed in podcontract.FAILED_EVALUATIONS:
        assert int(failed.exit_code) in fail_fast
        trainer.report("evaluate", evaluation={"outcome": str(failed)}, message="m")
        # the failed pod as the kubelet reports it: the exit code and the termination message, structured
        term = {"exitCode": int(failed.exit_code), "reason": "Error", "message": termination_log.read_text(),
                "finishedAt": "t"}  # fmt: skip
        pod = {
            "metadata": {"labels": {"speculators.dev/stage": "evaluate"}},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": term}}]},
        }
        obs = Observed(generation=1, status=SpeculatorTrainJobStatus(), jobs={"evaluate": {}})
        assert observe_pods(obs, [pod]) == {"evaluate"}
        assert obs.failures["evaluate"].startswith(f"Error (exit code {int(failed.exit_code)})")  # what the run says
        assert evaluation_of(obs) == {"outcome": failed.value}
    assert int(ExitCode.PROBLEM) not in fail_fast  # a server that restarted mid-measure is measured again


def test_the_progress_line_reads_back_and_lands_in_the_status() -> None:
    tracker = Tracker("train")
    tracker.line("Training epoch 1/3 started")
    tracker.line("train/loss=2.500, train/full_acc_0=0.500, epoch=0, lr=1.00e-04, global_step=7")
    line = tracker.render()
    parsed = podcontract.parse_progress(f"noise\n{line}\n", "train")
    assert parsed == {k: v for k, v in tracker.snapshot().items() if k != "stage"}
    status = operator_progress.merged(None, parsed, "train", datetime(2099, 1, 1, tzinfo=UTC))
    assert status["step"] == 7
    assert status["loss"] == 2.5
    assert status["stage"] == "train"
    assert set(tracker.snapshot()) <= podcontract.PROGRESS_FIELDS


def test_the_pod_and_the_operator_take_one_progress_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trainer.PROGRESS_SECONDS == Settings().progress_seconds == podcontract.PROGRESS_SECONDS_DEFAULT
    monkeypatch.setenv(podcontract.PROGRESS_SECONDS_ENV, "2.5")
    assert podcontract.progress_seconds() == 2.5
    monkeypatch.setenv(podcontract.REPORT_PATH_ENV, "/tmp/x")
    assert podcontract.report_path() == "/tmp/x"
    monkeypatch.delenv(podcontract.REPORT_PATH_ENV)
    assert podcontract.report_path() == "/dev/termination-log"
    assert json.loads(podcontract.progress_line({"stage": "train", "step": None})[len(podcontract.PROGRESS_PREFIX) :])


def _decoded(log: Path) -> StageReport:
    found = StageReport.decode(log.read_text())
    assert found is not None
    return found


def test_the_fetch_stages_report_reads_back(termination_log: Path, tmp_path: Path) -> None:
    verifier, data = tmp_path / "verifier", tmp_path / "data"
    verifier.mkdir()
    (verifier / "config.json").write_text("{}")
    data.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (data / name).write_text("{}\n")
    dest = tmp_path / "ws" / "verifier"
    assert trainer.fetch(str(verifier), str(dest), None, [f"{data}={tmp_path / 'ws' / 'data'}"]) == 0
    found = _decoded(termination_log)
    assert (found.stage, found.verifier, found.data_files, found.converted) == ("fetch", str(dest), 2, None)


@pytest.mark.parametrize(
    ("stage", "made", "expect"),
    [
        ("train", ["0/", "1/"], {"epoch": 2}),
        ("extract", ["hs_0.safetensors", "hs_1.safetensors", "hs_2.safetensors"], {"samples": 3}),
        ("convert", ["config.json", "model.safetensors"], {"files": 2}),
    ],
)
def test_a_tool_stages_report_reads_back(
    stage: str, made: list[str], expect: dict[str, Any], termination_log: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in made:
        (out / name).mkdir() if name.endswith("/") else (out / name).write_text("x")
    flag = {"train": "--save-path", "extract": "--output", "convert": "--output-path"}[stage]
    assert trainer.run(stage, [sys.executable, "-c", "pass", flag, str(out)]) == 0
    found = _decoded(termination_log)
    assert found.stage == stage
    assert found.seconds is not None
    assert {k: getattr(found, k) for k in expect} == expect
