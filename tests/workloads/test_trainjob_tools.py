"""A SpeculatorTrainJob's rendered commands, run with the real tools: the speculators 0.9.0 CLI parses every
command line the operator renders; the trainer entrypoint runs fetch (from S3), prepare-data, `train
--dry-run`, the audit and the publish (to S3) for a tiny verifier; the extraction server's command starts
the real vLLM CPU build to /health. The workspace mount point is replaced by a local folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from speculator_harness import S3Info
from speculator_harness.cluster import free_port
from speculator_operator.adapters.checkpoints import audit, load_checkpoint, load_verifier_config
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.render.training import WORKSPACE, Inputs, server, stages

from .conftest import REPO, container_argv, ensure_bucket
from .test_rendered_serving import RenderedServer

pytestmark = pytest.mark.workloads

BASE: dict[str, Any] = {"verifier": {"model": "s3://models/tiny"}, "output": {"uri": "s3://drafts/tiny"}}
VARIANTS: list[dict[str, Any]] = [
    {"algorithm": "eagle3", "draft": {"draftVocabSize": 256, "tttSteps": 4},
     "data": {"sources": ["s3://data/rows.jsonl"], "format": "pretokenized",
              "regenerate": {"dataset": "ultrachat", "limit": 8,
                                                                  "samplingParams": {"temperature": 0.7}}},
     "training": {"extraArgs": ["--save-best", "--checkpoint-freq", "1", "--loss-fn=ce"]}},
    {"algorithm": "peagle", "draft": {"numDepths": 6}, "data": {"sources": ["hf:org/chats"]},
     "hiddenStates": {"mode": "online"}},
    {"algorithm": "dflash", "draft": {"blockSize": 8, "numLayers": 2}, "data": {"sources": ["hf:org/chats"]},
     "hiddenStates": {"mode": "online", "backend": "mooncake", "mooncakeMaster": "mc:50051"},
     "training": {"nodes": 2, "gpusPerNode": 8, "fsdp": True}},
    {"algorithm": "dflash2", "data": {"sources": ["hf:org/chats"], "maxSamples": 100, "seqLength": 2048},
     "hiddenStates": {"backend": "fp8", "replicas": 2}, "training": {"lr": 0.0003}},
    {"algorithm": "dspark", "data": {"sources": ["s3://data/rows.jsonl"], "format": "pretokenized"},
     "training": {"dryRun": True}},
    {"algorithm": "mtp", "draft": {"numSpeculativeSteps": 2}, "data": {"sources": ["hf:org/chats"]}},
    {"algorithm": "eagle3", "convert": {"source": "hf://org/eagle3", "normBeforeResidual": True},
     "draft": {"targetLayerIds": [1, 4, 6]}},
    {"algorithm": "dflash", "convert": {"source": "s3://drafts/zlab"}, "draft": {"targetLayerIds": [2, 5]}},
    {"algorithm": "mtp", "convert": {"source": "hf://Qwen/Qwen3-Next"}, "draft": {"numSpeculativeSteps": 3}},
]  # fmt: skip


def rendered(spec: dict[str, Any], layers: int = 8, name: str = "tiny") -> Inputs:
    parsed = SpeculatorTrainJobSpec.model_validate({**BASE, **spec})
    return Inputs(name, "ml", parsed, get_release(), "s3:abc", layers, "uid")


def tool_argv(command: list[str]) -> list[str] | None:
    """The `speculators ...` argv of a stage command (torchrun launches `-m speculators.train`)."""
    command = [a.replace("$(JOB_COMPLETION_INDEX)", "0") for a in command]
    if command[0] == "speculators":
        return command
    if command[0] == "torchrun":
        return ["speculators", "train", *command[command.index("speculators.train") + 1 :]]
    return None


def test_every_rendered_speculators_command_is_accepted_by_the_real_cli(workloads_env: Path) -> None:
    argvs = []
    for spec in VARIANTS:
        for stage in stages(rendered(spec)):
            argv = tool_argv(stage.command)
            if argv is not None:
                argvs.append(argv)
    assert {a[1] for a in argvs} == {
        "regenerate-responses", "prepare-data", "generate-offline-data", "train", "convert", "stitch-mtp"
    }  # fmt: skip
    # a control the parser must refuse: hybrid caching is gone in 0.9.0
    control = ["speculators", "train", "--verifier-name-or-path", "x", "--on-generate", "cache"]
    out = subprocess.run(
        [str(workloads_env / "bin" / "python"), str(REPO / "tests" / "workloads" / "check_commands.py")],
        input=json.dumps([*argvs, control]), capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    *checked, refused = results
    bad = [(r["argv"], r["error"]) for r in checked if not r["ok"]]
    assert not bad, bad
    assert not refused["ok"]
    assert "on-generate" in refused["error"] or "invalid choice" in refused["error"]


def test_the_trainer_entrypoint_runs_the_real_pipeline_and_publishes_to_s3(
    workloads_env: Path, dry_run_checkpoints: dict[str, Path], s3: S3Info, tmp_path: Path
) -> None:
    verifier_dir = dry_run_checkpoints["verifier"]
    s3c = s3.client()
    for bucket in ("models", "data", "drafts"):
        ensure_bucket(s3, bucket)
    for f in verifier_dir.iterdir():
        s3c.upload_file(str(f), "models", f"tiny/{f.name}")
    rows = [{"input_ids": [5 + (i * 7 + j) % 500 for j in range(40)], "loss_mask": [0] * 10 + [1] * 30}
            for i in range(16)]  # fmt: skip
    s3c.put_object(Bucket="data", Key="rows.jsonl", Body="".join(json.dumps(r) + "\n" for r in rows).encode())

    env = {**os.environ, **s3.env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM":
           "false", "PATH": f"{Path(sys.executable).parent}:{workloads_env / 'bin'}:{os.environ['PATH']}"}  # fmt: skip
    config, revision = load_verifier_config("s3://models/tiny", s3.env())
    spec = {"algorithm": "eagle3", "draft": {"draftVocabSize": 256},
            "data": {"sources": ["s3://data/rows.jsonl"], "format": "pretokenized", "seqLength": 256},
            "training": {"dryRun": True, "epochs": 1}}  # fmt: skip
    inputs = Inputs("tiny", "ml", SpeculatorTrainJobSpec.model_validate({**BASE, **spec}), get_release(), revision,
                    config["num_hidden_layers"], "uid")  # fmt: skip
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    reports = {}
    for stage in stages(inputs):
        argv = container_argv(stage.children[0], workspace)
        report = tmp_path / f"{stage.name}.report"
        result = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                                env={**env, "SPECULATOR_REPORT_PATH": str(report)})  # fmt: skip
        assert result.returncode == 0, f"{stage.name}: {' '.join(argv)}\n{result.stderr[-4000:]}"
        reports[stage.name] = json.loads(report.read_text())
    assert list(reports) == ["fetch", "prepare", "train", "audit", "publish"]
    assert reports["prepare"]["samples"] == 16
    assert reports["prepare"]["fingerprint"]
    assert (workspace / "prepared" / "token_freq.pt").exists()  # --no-skip-token-freq: the vocabulary is pruned
    assert reports["train"]["epoch"] == 0
    assert reports["audit"]["audit"]["ok"] is True

    # published to its own content-addressed folder; output.uri's pointer leads there
    location = reports["publish"]["uri"]
    assert location.startswith("s3://drafts/tiny/sha256-")
    published = load_checkpoint("s3://drafts/tiny", s3.env())
    assert published.uri == location
    assert published.config["draft_vocab_size"] == 256  # not the silent full-vocabulary fallback
    assert published.config["speculators_config"]["verifier"]["name_or_path"] == "s3://models/tiny"
    # the record names the verifier revision it was trained for: the audit against that verifier proves it
    report = audit(published, verifier=config, verifier_revision=revision, release=get_release())
    assert report.ok
    assert not [f for f in report.findings if f.rule in ("verifier-revision", "provenance")]
    key = location.removeprefix("s3://drafts/") + "/speculators-provenance.json"
    marker = json.loads(s3c.get_object(Bucket="drafts", Key=key)["Body"].read())
    assert marker["digest"] == reports["publish"]["digest"]
    assert marker["verifierRevision"] == revision
    assert published.manifest is not None
    assert all(f.sha256 for f in published.manifest.files if f.name != "speculators-provenance.json")


SERVER_SPEC: dict[str, Any] = {  # conversations, rendered by the plain verifier server
    "algorithm": "eagle3",
    "data": {"sources": ["s3://data/chat.jsonl"], "seqLength": 256},
    "hiddenStates": {"extraArgs": ["--enforce-eager", "--max-model-len", "512"]},
}
REGENERATE_SPEC: dict[str, Any] = {  # on-policy answers by the same server (no render endpoint needed)
    **SERVER_SPEC,
    "data": {
        "regenerate": {"dataset": "s3://data/chat.jsonl", "limit": 2, "maxTokens": 8, "concurrency": 2},
        "seqLength": 256,
    },
}


def local(arg: str, workspace: Path, endpoint: str | None = None) -> str:
    """A rendered argument with the workspace mount and the in-cluster server address made local."""
    arg = arg.replace(WORKSPACE, str(workspace))
    return arg.replace("http://tiny-verifier.ml.svc:8000", endpoint) if endpoint else arg


def start_rendered_server(vllm_env: Path, verifier: Path, tmp_path: Path, role: str) -> tuple[RenderedServer, Path]:
    """The `role` server's container command, run locally: the workspace is a short local folder holding
    the tiny verifier (vLLM's served name is that path, and so is the trainer's verifier name)."""
    dep, _ = server(rendered(SERVER_SPEC), role)
    workspace = Path(tempfile.mkdtemp(prefix="ws-", dir=tmp_path))
    shutil.copytree(verifier, workspace / "verifier")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    command = [local(a, workspace) for a in c["command"]]
    args = [local(a, workspace) for a in c["args"]]
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(free_port())
    srv = RenderedServer(vllm_env, command, args, tmp_path / f"{role}.log")
    try:
        srv.wait_healthy()
    except BaseException:
        srv.stop()
        raise
    return srv, workspace


def test_the_extraction_server_command_starts_the_real_vllm(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    srv, workspace = start_rendered_server(vllm_env, dry_run_checkpoints["verifier"], tmp_path, "extractor")
    try:
        with urllib.request.urlopen(srv.url("/v1/models"), timeout=10) as resp:
            models = json.loads(resp.read())
        # the served model name is the path the trainer passes as --verifier-name-or-path
        assert [m["id"] for m in models["data"]] == [str(workspace / "verifier")]
        assert "extract_hidden_states" in srv.log.read_text(errors="replace")
    finally:
        srv.stop()


def test_regenerate_and_prepare_run_against_the_rendered_verifier_server(
    vllm_env: Path, workloads_env: Path, dry_run_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """On-policy data for real: the rendered plain verifier server answers the rendered
    regenerate-responses, and renders the conversations for the rendered prepare-data
    (--enable-scale-out opens that endpoint)."""
    srv, workspace = start_rendered_server(vllm_env, dry_run_checkpoints["verifier"], tmp_path, "verifier")
    try:
        rows = [{"conversations": [{"role": "user", "content": f"what does the draft do {i}"},
                                   {"role": "assistant", "content": "it predicts the next word"}]}
                for i in range(4)]  # fmt: skip
        text = "".join(json.dumps(r) + "\n" for r in rows)
        for folder in ("sources/0", "sources/regenerate"):  # where the fetch stage puts them
            (workspace / folder).mkdir(parents=True)
            (workspace / folder / "chat.jsonl").write_text(text)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PATH": f"{Path(sys.executable).parent}:{workloads_env / 'bin'}:{os.environ['PATH']}"}  # fmt: skip
        reports = {}
        for label, spec, stage in [("conversations", SERVER_SPEC, "prepare"), ("regenerated", REGENERATE_SPEC,
                                   "regenerate"), ("regenerated", REGENERATE_SPEC, "prepare")]:  # fmt: skip
            job = next(s for s in stages(rendered(spec)) if s.name == stage).children[0]
            (c,) = job["spec"]["template"]["spec"]["containers"]
            argv = [local(a, workspace, srv.url("")) for a in [*c["command"], *c["args"]]]
            report = tmp_path / f"{label}-{stage}.report"
            result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                                    env={**env, "SPECULATOR_REPORT_PATH": str(report)})  # fmt: skip
            assert result.returncode == 0, f"{stage}: {' '.join(argv)}\n{result.stderr[-4000:]}"
            reports[label, stage] = json.loads(report.read_text())
        assert reports["conversations", "prepare"]["samples"] == 4  # one row per assistant turn
        assert reports["regenerated", "regenerate"]["samples"] == 2  # --limit 2, answered by the verifier itself
        regenerated = [json.loads(line) for line in (workspace / "regenerated" / "data.jsonl").open()]
        assert all(1 in r["loss_mask"] and 0 in r["loss_mask"] for r in regenerated)
        assert reports["regenerated", "prepare"]["samples"] == 2
        assert reports["regenerated", "prepare"]["fingerprint"] != reports["conversations", "prepare"]["fingerprint"]
    finally:
        srv.stop()
