"""A SpeculatorTrainJob that converts a published third-party draft, and an MTP head stitched into its
verifier and served by the pinned vLLM's CPU build. Each rendered stage's command runs with the real tools (the
trainer entrypoint, speculators 0.9.0's `convert` and `stitch-mtp`); the verifier and the source come from a
real S3 server and the result is published to it. The third-party checkpoints are written here in their
publishers' layouts (tests/workloads/thirdparty.py), not speculators' own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from speculator_harness import S3Info
from speculator_harness.cluster import free_port
from speculator_operator.adapters.checkpoints import audit, load_checkpoint, load_verifier_config
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.render.serving import DRAFT_DIR, VERIFIER_DIR, Draft, render
from speculator_operator.render.serving import Inputs as ServingInputs
from speculator_operator.render.training import Inputs, stages

from .conftest import REPO, container_argv, ensure_bucket, run_in
from .test_rendered_serving import RenderedServer
from .test_vllm_cpu import post

pytestmark = pytest.mark.workloads
THIRDPARTY = REPO / "tests" / "workloads" / "thirdparty.py"


def upload(s3: S3Info, folder: Path, bucket: str, prefix: str) -> str:
    s3c = ensure_bucket(s3, bucket)
    for f in folder.iterdir():
        s3c.upload_file(str(f), bucket, f"{prefix}/{f.name}")
    return f"s3://{bucket}/{prefix}"


def run_stages(
    s3: S3Info, workloads_env: Path, spec: dict[str, Any], verifier: str, tmp_path: Path
) -> tuple[dict[str, dict[str, Any]], dict[str, subprocess.CompletedProcess[str]]]:
    """Every stage in order, each one's container command run here, until one fails: (reports, results)."""
    config, revision = load_verifier_config(verifier, s3.env())
    parsed = SpeculatorTrainJobSpec.model_validate({"verifier": {"model": verifier}, **spec})
    inputs = Inputs("tiny", "ml", parsed, get_release(), revision, config["num_hidden_layers"], "uid")
    env = {**os.environ, **s3.env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM":
           "false", "PATH": f"{Path(sys.executable).parent}:{workloads_env / 'bin'}:{os.environ['PATH']}"}  # fmt: skip
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    reports: dict[str, dict[str, Any]] = {}
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    for stage in stages(inputs):
        report = tmp_path / f"{stage.name}.report"
        argv = container_argv(stage.children[0], workspace)
        stage_env = {**env, "SPECULATOR_REPORT_PATH": str(report)}
        result = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=stage_env)
        results[stage.name] = result
        if result.returncode != 0:
            break
        reports[stage.name] = json.loads(report.read_text())
    return reports, results


@pytest.fixture(scope="module")
def tiny_verifier(s3: S3Info, dry_run_checkpoints: dict[str, Path]) -> tuple[Path, str]:
    folder = dry_run_checkpoints["verifier"]
    ensure_bucket(s3, "drafts")
    return folder, upload(s3, folder, "models", "tiny")


@pytest.mark.parametrize("algorithm", ["eagle3", "dflash"])
def test_a_third_party_draft_is_converted_audited_and_published(
    workloads_env: Path, s3: S3Info, tiny_verifier: tuple[Path, str], tmp_path: Path, algorithm: str
) -> None:
    folder, verifier = tiny_verifier
    layout = tmp_path / "thirdparty"
    run_in(workloads_env, "python", str(THIRDPARTY), algorithm, str(layout), "--verifier", str(folder))
    assert "speculators_model_type" not in json.loads((layout / "config.json").read_text())
    source = upload(s3, layout, "thirdparty", f"{algorithm}-good")
    spec = {"algorithm": algorithm, "convert": {"source": source}, "output": {"uri": f"s3://drafts/{algorithm}"}}
    reports, results = run_stages(s3, workloads_env, spec, verifier, tmp_path)
    failed = {k: r.stderr[-3000:] for k, r in results.items() if r.returncode}
    assert not failed, failed
    assert list(reports) == ["fetch", "convert", "audit", "publish"]
    assert reports["fetch"]["converted"] == source
    assert reports["audit"]["audit"]["ok"] is True
    assert reports["audit"]["algorithm"] == algorithm
    published = load_checkpoint(f"s3://drafts/{algorithm}", s3.env())
    assert published.uri == reports["publish"]["uri"]
    assert published.algorithm == algorithm
    assert published.config["speculators_config"]["verifier"]["name_or_path"] == verifier
    config, revision = load_verifier_config(verifier, s3.env())
    report = audit(published, verifier=config, verifier_revision=revision, release=get_release())
    assert report.ok, [f.as_dict() for f in report.errors]
    if algorithm == "dflash":  # z-lab's target ids [1, 4, 6] are hidden_states[i + 1]: speculators' 2, 5, 7
        assert published.aux_layer_ids == [2, 5, 7]
        # full attention everywhere, trained non-causal: marked so, or vLLM would serve it causal
        assert published.config["sliding_window_non_causal"] is True
        assert "sliding_window_non_causal set true" in results["convert"].stderr
    else:  # SafeAILab's EAGLE-3 ships no embedding: vLLM lends it the verifier's
        assert "embed_tokens.weight" not in published.tensors
        assert any(f.rule == "embed-tokens-shared" for f in report.findings)


BROKEN = {
    # the eagle3 converter warns and saves random weights in place of a missing tensor: the stage refuses it
    ("eagle3", "missing"): "missing keys: ['layers.0.self_attn.q_proj.weight']",
    # a head count that does not divide the hidden size: the converter's Llama config refuses it
    ("eagle3", "config"): "is not a multiple of the number of",
    ("dflash", "missing"): "Draft weights missing after load",
    ("dflash", "config"): "Checkpoint config has no `block_size`",
}


@pytest.mark.parametrize(("algorithm", "fault"), sorted(BROKEN))
def test_a_malformed_third_party_draft_fails_its_convert_stage_with_the_reason(
    workloads_env: Path, s3: S3Info, tiny_verifier: tuple[Path, str], tmp_path: Path, algorithm: str, fault: str
) -> None:
    folder, verifier = tiny_verifier
    layout = tmp_path / "thirdparty"
    run_in(workloads_env, "python", str(THIRDPARTY), algorithm, str(layout), "--verifier", str(folder),
           "--break", fault)  # fmt: skip
    source = upload(s3, layout, "thirdparty", f"{algorithm}-{fault}")
    spec = {"algorithm": algorithm, "convert": {"source": source}, "output": {"uri": f"s3://drafts/{fault}"}}
    reports, results = run_stages(s3, workloads_env, spec, verifier, tmp_path)
    assert list(results) == ["fetch", "convert"], "the run went on past a failed conversion"
    assert results["convert"].returncode == 1  # the Job's podFailurePolicy fails fast on 1: no retry mends it
    assert BROKEN[(algorithm, fault)] in results["convert"].stderr[-4000:]  # what the stage's message quotes
    assert "publish" not in reports


@pytest.fixture(scope="module")
def stitched_run(
    workloads_env: Path, s3: S3Info, tiny_verifier: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, str, dict[str, dict[str, Any]], dict[str, subprocess.CompletedProcess[str]]]:
    """A Qwen3-Next with its native MTP layer (the verifier), converted to speculators' mtp format and stitched
    back: (the model, the workspace, the verifier's s3:// location, reports, results)."""
    folder, _ = tiny_verifier
    tmp_path = tmp_path_factory.mktemp("mtp")
    model = tmp_path / "qwen3-next"
    run_in(workloads_env, "python", str(THIRDPARTY), "qwen3-next-mtp", str(model), "--verifier", str(folder))
    verifier = upload(s3, model, "models", "qwen3-next")
    spec = {"algorithm": "mtp", "draft": {"numSpeculativeSteps": 1}, "convert": {"source": verifier},
            "output": {"uri": "s3://drafts/qwen3-next-mtp"}}  # fmt: skip
    reports, results = run_stages(s3, workloads_env, spec, verifier, tmp_path)
    return model, tmp_path / "workspace", verifier, reports, results


def test_a_native_mtp_head_is_converted_stitched_back_audited_and_published(
    s3: S3Info, stitched_run: tuple[Path, Path, str, dict[str, dict[str, Any]], Any]
) -> None:
    _, _, verifier, reports, results = stitched_run
    failed = {k: r.stderr[-3000:] for k, r in results.items() if r.returncode}
    assert not failed, failed
    assert list(reports) == ["fetch", "convert", "stitch", "audit", "publish"]
    assert reports["stitch"]["checkpoint"].endswith("/stitched")
    published = load_checkpoint("s3://drafts/qwen3-next-mtp", s3.env())
    assert published.stitched_mtp
    assert published.mtp_layers == 1
    assert "mtp.fc.weight" in published.tensors
    prefix = published.uri.removeprefix("s3://drafts/") + "/"
    listing = s3.client().list_objects_v2(Bucket="drafts", Prefix=prefix)["Contents"]
    # vLLM serves it as the target model: the verifier's tokenizer goes with it
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {o["Key"].removeprefix(prefix) for o in listing}
    config, _ = load_verifier_config(verifier, s3.env())
    report = audit(published, verifier=config, release=get_release(), speculative_tokens=1)
    assert report.ok, [f.as_dict() for f in report.errors]


def test_the_stitched_model_is_served_by_the_rendered_command_with_method_mtp(
    vllm_env: Path, stitched_run: tuple[Path, Path, str, Any, Any], tmp_path: Path
) -> None:
    """The pinned vLLM's CPU build serves the stitched Qwen3-Next as the target with {"method": "mtp"}: the
    entrypoint audits it as a stitched model first, and vLLM counts the MTP drafts. On the CPU, prefix caching
    goes off through the spec's extraArgs: with it, vLLM keeps the linear-attention state in its 'align' mode,
    whose copy is a Triton kernel the CPU build lacks (seen here)."""
    model, workspace, _, _, _ = stitched_run
    spec = SpeculatorDeploymentSpec.model_validate({
        "verifier": {"model": "pvc://models/qwen3-next"}, "speculator": {"source": "pvc://models/stitched"},
        "serving": {"numSpeculativeTokens": 1, "maxNumSeqs": 4,
                    "extraArgs": ["--enforce-eager", "--max-model-len", "512", "--no-enable-prefix-caching"]},
    })  # fmt: skip
    r = render(ServingInputs("tiny", "default", spec, get_release(), Draft("mtp", 1, stitched=True)))
    (container,) = r.children[0]["spec"]["template"]["spec"]["containers"]

    def local(arg: str) -> str:
        return arg.replace(DRAFT_DIR, str(workspace / "stitched")).replace(VERIFIER_DIR, str(model))

    command = [local(a) for a in container["command"]]
    args = [local(a) for a in container["args"]]
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(free_port())
    server = RenderedServer(vllm_env, command, args, tmp_path / "serve.log")
    try:
        server.wait_healthy()
        log = (tmp_path / "serve.log").read_text(errors="replace")
        assert "serve: audit ok" in log
        assert "Qwen3NextMTP" in log  # vLLM built the MTP drafter from the model's own layers
        out = post(server.url("/v1/completions"), {"model": "tiny", "prompt": "the draft", "max_tokens": 8,
                                                   "temperature": 0})  # fmt: skip
        assert out["choices"][0]["text"]
        with urllib.request.urlopen(server.url("/metrics"), timeout=10) as resp:
            metrics = resp.read().decode()
        drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")]
        assert drafts, "no spec-decode counters"
        assert float(drafts[0].rsplit(" ", 1)[1]) > 0, drafts
    finally:
        server.stop()
