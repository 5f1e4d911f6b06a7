"""The evaluate stage with the real tools: the rendered prepare stage (real `speculators prepare-data`, run by
the trainer entrypoint in the speculators environment, as in the trainer image) splits held-out samples off
the prepared data; the rendered evaluation server (`speculator-operator serve --speculate`, the real vLLM
CPU build) serves the verifier with a draft whose acceptance is known by construction
(hack/lib/known_acceptance_pair.py), and the rendered evaluate client measures it: the agreeing draft
passes, the disagreeing one is refused (exit 3, AcceptanceBelowThreshold), and a server without a draft
is ZeroDrafts (exit 4). Prints the stage's wall time and the tokens evaluated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from speculator_harness.cluster import free_port
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.render.training import WORKSPACE, Inputs, server, stages

from .conftest import REPO, container_argv
from .test_rendered_serving import RenderedServer

pytestmark = pytest.mark.workloads

ROWS = 16
HELD_OUT = 4
SPEC: dict[str, Any] = {
    "verifier": {"model": "s3://models/tiny"},
    "output": {"uri": "s3://drafts/tiny"},
    "algorithm": "eagle3",
    "data": {"sources": ["s3://data/rows.jsonl"], "format": "pretokenized", "seqLength": 256},
    "hiddenStates": {"extraArgs": ["--enforce-eager", "--max-model-len", "512"]},
    "evaluation": {"minAcceptance": 0.5, "heldOut": HELD_OUT, "maxTokens": 16, "timeoutSeconds": 600},
}


def rendered(spec: dict[str, Any] = SPEC) -> Inputs:
    return Inputs("tiny", "ml", SpeculatorTrainJobSpec.model_validate(spec), get_release(), "s3:abc", 8, "uid")


@pytest.fixture(scope="module")
def known_pair(workloads_env: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("known-pair")
    out = subprocess.run(
        [str(workloads_env / "bin" / "python"), str(REPO / "hack" / "lib" / "known_acceptance_pair.py"), str(root)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {k: Path(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


@pytest.fixture(scope="module")
def workspace_with_held_out(
    workloads_env: Path, known_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The rendered prepare stage, run for real on pretokenized rows: its report and what it left."""
    root = tmp_path_factory.mktemp("prepare")
    workspace = Path(tempfile.mkdtemp(prefix="ws-", dir=root))  # short: vLLM's served name is a path in it
    shutil.copytree(known_pair["verifier"], workspace / "verifier")
    rows = [
        {"input_ids": [5 + (i * 7 + j) % 500 for j in range(40)], "loss_mask": [0] * 10 + [1] * 30} for i in range(ROWS)
    ]
    (workspace / "sources" / "0").mkdir(parents=True)
    (workspace / "sources" / "0" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare = next(s for s in stages(rendered()) if s.name == "prepare")
    argv = container_argv(prepare.children[0], workspace)
    assert argv[0] == "speculator-operator"
    # the trainer image runs the operator's entrypoint in the speculators environment (datasets is there)
    argv = [str(workloads_env / "bin" / "python"), "-m", "speculator_operator.cli", *argv[1:]]
    report = root / "prepare.report"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "operator"),
        "SPECULATOR_REPORT_PATH": str(report),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PATH": f"{workloads_env / 'bin'}:{os.environ['PATH']}",
    }
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=root, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    (workspace / "prepare.report").write_text(report.read_text())
    return workspace


def test_prepare_splits_the_held_out_samples_off_before_training_sees_them(
    workloads_env: Path, workspace_with_held_out: Path
) -> None:
    ws = workspace_with_held_out
    reported = json.loads((ws / "prepare.report").read_text())
    assert (reported["samples"], reported["heldOut"]) == (ROWS - HELD_OUT, HELD_OUT)
    prompts = [json.loads(line)["prompt_token_ids"] for line in (ws / "held-out" / "prompts.jsonl").open()]
    assert len(prompts) == HELD_OUT
    assert all(len(p) == 10 for p in prompts)  # the tokens before the first one the loss counts
    # what is left is a dataset speculators reads, without the held-out samples
    check = (
        "import json, sys\nfrom datasets import load_from_disk\n"
        "ds = load_from_disk(sys.argv[1])\nprint(json.dumps([[int(t) for t in r[:10]] for r in ds['input_ids']]))"
    )
    out = subprocess.run(
        [str(workloads_env / "bin" / "python"), "-c", check, str(ws / "prepared")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    kept = json.loads(out.stdout)
    assert len(kept) == ROWS - HELD_OUT
    assert not [p for p in prompts if p in kept]


def start_server(vllm_env: Path, inputs: Inputs, role: str, workspace: Path, log: Path) -> RenderedServer:
    dep, _ = server(inputs, role)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    command = [a.replace(WORKSPACE, str(workspace)) for a in c["command"]]
    args = [a.replace(WORKSPACE, str(workspace)) for a in c["args"]]
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(free_port())
    srv = RenderedServer(vllm_env, command, args, log)
    try:
        srv.wait_healthy()
    except BaseException:
        srv.stop()
        raise
    return srv


def evaluate(inputs: Inputs, workspace: Path, endpoint: str, report: Path) -> tuple[int, dict[str, Any], str]:
    stage = next(s for s in stages(inputs) if s.name == "evaluate")
    argv = container_argv(stage.children[0], workspace)
    argv = [a.replace("http://tiny-evaluator.ml.svc:8000", endpoint) for a in argv]
    env = {
        **os.environ,
        "SPECULATOR_REPORT_PATH": str(report),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    return result.returncode, json.loads(report.read_text()), result.stderr


@pytest.mark.parametrize(
    ("draft", "code", "outcome"), [("agree", 0, "Passed"), ("disagree", 3, "AcceptanceBelowThreshold")]
)
def test_the_pinned_vllm_judges_a_draft_built_to_agree_or_to_disagree(
    vllm_env: Path,
    known_pair: dict[str, Path],
    workspace_with_held_out: Path,
    tmp_path: Path,
    draft: str,
    code: int,
    outcome: str,
) -> None:
    ws = workspace_with_held_out
    shutil.rmtree(ws / "checkpoints", ignore_errors=True)
    shutil.copytree(known_pair[draft], ws / "checkpoints")  # where training would have written it
    inputs = rendered()
    t0 = time.monotonic()
    srv = start_server(vllm_env, inputs, "evaluator", ws, tmp_path / "evaluator.log")
    try:
        started = time.monotonic() - t0
        log = srv.log.read_text(errors="replace")
        assert "serve: audit ok" in log  # audited again where vLLM reads it
        assert '"method":"eagle3"' in log  # the speculative config built from the checkpoint in the pod
        got, reported, stderr = evaluate(inputs, ws, srv.url(""), tmp_path / "evaluate.report")
    finally:
        srv.stop()
    ev = reported["evaluation"]
    assert (got, ev["outcome"]) == (code, outcome), stderr[-3000:]
    assert ev["prompts"] == HELD_OUT
    assert ev["tokens"] == HELD_OUT * 16  # EOS ignored: every request generated maxTokens
    assert ev["drafts"] > 0
    if draft == "agree":
        assert ev["rate"] == 1.0  # every drafted token is the verifier's greedy choice
        assert ev["meanAcceptedLength"] == ev["k"] + 1
    else:
        assert ev["rate"] == 0.0
        assert "below evaluation.minAcceptance 0.5" in reported["message"]
    print(
        f"\nevaluate ({draft}): server ready in {started:.0f} s, client {ev['seconds']} s for {ev['tokens']} tokens "
        f"over {ev['prompts']} prompts: acceptance {ev['rate']}, {ev['drafts']} drafts, K={ev['k']}"
    )


def test_a_server_without_the_draft_is_zero_drafts(
    vllm_env: Path, known_pair: dict[str, Path], workspace_with_held_out: Path, tmp_path: Path
) -> None:
    """The plain verifier server (no speculative config) in the evaluator's place: nothing is drafted."""
    ws = workspace_with_held_out
    shutil.rmtree(ws / "checkpoints", ignore_errors=True)
    shutil.copytree(known_pair["agree"], ws / "checkpoints")
    inputs = rendered()
    srv = start_server(vllm_env, inputs, "verifier", ws, tmp_path / "plain.log")
    try:
        got, reported, stderr = evaluate(inputs, ws, srv.url(""), tmp_path / "evaluate.report")
    finally:
        srv.stop()
    assert got == 4, stderr[-3000:]
    assert reported["evaluation"]["outcome"] == "ZeroDrafts"
    assert reported["evaluation"]["tokens"] == HELD_OUT * 16
