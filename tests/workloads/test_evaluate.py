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


def client_env(report: Path) -> dict[str, str]:
    """A stage client's environment: its report where the kubelet would read it, this package's entrypoint on PATH."""
    return {
        **os.environ,
        "SPECULATOR_REPORT_PATH": str(report),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }


def with_draft(workspace: Path, draft: Path) -> None:
    """`draft` where training would have written it."""
    shutil.rmtree(workspace / "checkpoints", ignore_errors=True)
    shutil.copytree(draft, workspace / "checkpoints")


def evaluate(inputs: Inputs, workspace: Path, endpoint: str, report: Path) -> tuple[int, dict[str, Any], str]:
    stage = next(s for s in stages(inputs) if s.name == "evaluate")
    argv = container_argv(stage.children[0], workspace)
    argv = [a.replace("http://tiny-evaluator.ml.svc:8000", endpoint) for a in argv]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=client_env(report))
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
    with_draft(ws, known_pair[draft])
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
    known_pair: dict[str, Path], workspace_with_held_out: Path, plain_server: RenderedServer, tmp_path: Path
) -> None:
    """The plain verifier server (no speculative config: the sweep's plain server) in the evaluator's place: nothing
    is drafted."""
    ws = workspace_with_held_out
    with_draft(ws, known_pair["agree"])
    got, reported, stderr = evaluate(rendered(), ws, plain_server.url(""), tmp_path / "evaluate.report")
    assert got == 4, stderr[-3000:]
    assert reported["evaluation"]["outcome"] == "ZeroDrafts"
    assert reported["evaluation"]["tokens"] == HELD_OUT * 16


# ---- the sweep (spec.evaluation.sweep): one server lifetime per K, the curve assembled as the planner does ----------

SWEEP_K = 3  # the sweep measures K = 3, ⌈3/2⌉ = 2 and plain decoding
SWEEP_SPEC: dict[str, Any] = {
    **SPEC,
    "evaluation": {
        **SPEC["evaluation"],
        "numSpeculativeTokens": SWEEP_K,
        "sweep": {"maxConcurrency": 64, "rounds": 1, "timeoutSeconds": 900},
    },
}


@pytest.fixture(scope="module")
def plain_server(vllm_env: Path, workspace_with_held_out: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The sweep's plain-decoding server (sweeper-plain: the verifier, no draft), started once for the module: the
    zero-drafts check, the sweep's plain stage and, last, the server killed mid-sweep all run against it. Each client
    reads vLLM's counters before and after what it measures, so what an earlier check sent is not counted."""
    stage = next(s for s in stages(rendered(SWEEP_SPEC)) if s.name == "sweep-plain")
    assert stage.server is not None
    srv = start_server(vllm_env, rendered(SWEEP_SPEC), stage.server, workspace_with_held_out,
                       tmp_path_factory.mktemp("plain-server") / "plain.log")  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def run_client(stage: Any, workspace: Path, endpoint: str, report: Path) -> subprocess.Popen[str]:
    argv = container_argv(stage.children[0], workspace)
    argv = [a.replace(f"http://tiny-{stage.server}.ml.svc:8000", endpoint) for a in argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=client_env(report))


def test_the_sweep_measures_every_k_and_concurrency_into_one_consistent_curve(
    vllm_env: Path,
    known_pair: dict[str, Path],
    workspace_with_held_out: Path,
    plain_server: RenderedServer,
    tmp_path: Path,
) -> None:
    from speculator_operator.api.podcontract import StageReport
    from speculator_operator.domain.releases import get_release as release
    from speculator_operator.domain.sweep import PLAIN, choose
    from speculator_operator.planning.sweep import curve_of

    ws = workspace_with_held_out
    with_draft(ws, known_pair["agree"])
    inputs = rendered(SWEEP_SPEC)
    planned = [s for s in stages(inputs) if s.name.startswith("sweep-")]
    assert [(s.name, s.server) for s in planned] == [
        ("sweep-k", "evaluator"),
        ("sweep-half", "sweeper-half"),
        ("sweep-plain", "sweeper-plain"),
    ]
    reports: dict[str, StageReport] = {}
    t0 = time.monotonic()
    for stage in planned:
        assert stage.server is not None
        # the plain stage's server is the module's (its args are this spec's sweeper-plain), the others their own
        shared = stage.server == "sweeper-plain"
        log = tmp_path / f"{stage.name}.log"
        srv = plain_server if shared else start_server(vllm_env, inputs, stage.server, ws, log)
        try:
            client = run_client(stage, ws, srv.url(""), tmp_path / f"{stage.name}.report")
            _, stderr = client.communicate(timeout=900)
        finally:
            if not shared:
                srv.stop()
        assert client.returncode == 0, stderr[-3000:]
        reports[stage.name] = StageReport.model_validate_json((tmp_path / f"{stage.name}.report").read_text())
    seconds = time.monotonic() - t0
    assembled = curve_of(reports, stages(inputs))
    assert assembled.problem is None
    curve = assembled.curve
    assert curve is not None
    assert curve.device == "cpu"
    assert curve.ks == (SWEEP_K, 2)
    assert curve.concurrencies == (1, 2, 4)  # up to the held-out prompts, not maxConcurrency
    for p in curve.points:
        assert p.requests == p.concurrency  # one round
        assert p.tokens == p.requests * 16  # tokens counted = the requests' completions (EOS ignored)
        assert p.itl_ms is not None
        assert p.itl_ms > 0
        assert p.running is not None
        assert 0 < p.running <= p.concurrency  # decoding requests per step (a prefill step has none)
        if p.k == PLAIN:
            assert p.drafts is None
        else:
            assert p.drafts is not None
            assert p.drafts > 0
            assert p.accepted == p.drafts * p.k  # the agreeing draft: every drafted token accepted
    choice = choose(curve, max_num_seqs=256, k_limit=SWEEP_K, schedule_cost=release().schedule_cost)
    print(f"\nsweep: {len(curve.points)} points, 3 servers (2 started here) in {seconds:.0f} s; choice: {choice}")
    for c in curve.concurrencies:
        row = ", ".join(f"K={k}: {curve.rate(k, c):.1f} tok/s ITL {curve.at(k, c).itl_ms} ms" for k in (*curve.ks, 0))
        print(f"  c={c}: {row}; best K={curve.best(c)}")


def test_a_server_killed_mid_sweep_fails_the_stage_naming_the_point(
    known_pair: dict[str, Path], workspace_with_held_out: Path, plain_server: RenderedServer, tmp_path: Path
) -> None:
    """The module's plain server (this spec renders the same sweeper-plain), killed once the sweep is under way: the
    module's last use of it."""
    from speculator_operator.api.podcontract import StageReport
    from speculator_operator.planning.sweep import failed_at, failure_words

    ws = workspace_with_held_out
    with_draft(ws, known_pair["agree"])
    spec = {**SWEEP_SPEC, "evaluation": {**SWEEP_SPEC["evaluation"], "maxTokens": 256}}
    spec["evaluation"]["sweep"] = {**spec["evaluation"]["sweep"], "rounds": 8}
    inputs = rendered(spec)
    stage = next(s for s in stages(inputs) if s.name == "sweep-plain")
    assert stage.server is not None
    assert server(inputs, stage.server) == server(rendered(SWEEP_SPEC), stage.server)  # the module's server
    srv = plain_server
    report = tmp_path / "sweep.report"
    try:
        # what earlier checks generated on this server is counted already: the warm-up's tokens come on top
        baseline = generated_tokens(srv.url("/metrics"))
        client = run_client(stage, ws, srv.url(""), report)
        # the warm-up request is answered: the sweep's points are under way; the server goes
        wait_for_tokens(srv.url("/metrics"), baseline + 256, client)
        srv.stop()
        _, stderr = client.communicate(timeout=300)
    finally:
        srv.stop()
    assert client.returncode == 6, stderr[-3000:]
    left = StageReport.model_validate_json(report.read_text())
    where = failed_at(left)
    assert where is not None
    assert where["k"] == 0
    assert where["concurrency"] in (1, 2, 4)
    assert left.sweep is not None
    assert len(left.sweep["points"]) == [1, 2, 4].index(where["concurrency"])  # the points before it, not whole
    words = failure_words("sweep-plain", left, "Job failed")
    assert f"concurrency {where['concurrency']}" in words
    print(f"\nkilled mid-sweep: {words}")


def generated_tokens(metrics: str) -> float:
    """vLLM's count of the tokens it generated so far."""
    import urllib.request

    with urllib.request.urlopen(metrics, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                return float(line.split()[-1])
    return 0.0


def wait_for_tokens(metrics: str, tokens: float, client: subprocess.Popen[str]) -> None:
    """Until vLLM has counted `tokens` generated tokens (or the client ended)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and client.poll() is None:
        if generated_tokens(metrics) >= tokens:
            return
        time.sleep(0.2)
    raise AssertionError("vLLM never counted the warm-up's tokens")
