"""`speculator-operator render`: the GitOps preview of every child, for both kinds, without a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.cli import main
from speculator_operator.commands import render
from speculator_operator.commands.render import RenderOptions, render_documents
from speculator_operator.commands.usage import UsageError
from speculator_operator.domain.checkpoint import CheckpointError, VerifierRef

from ..ckptgen import dflash, mutate, write_checkpoint

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "examples" / "gpu"


def _unreadable(location: str, **_: object) -> NoReturn:
    raise CheckpointError(f"{location}: ConnectError: no network here")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the network: every checkpoint and verifier is unreadable unless a test says otherwise."""
    monkeypatch.setattr(render, "audit", _unreadable)
    monkeypatch.setattr(render, "read_verifier", _unreadable)


def test_a_train_job_renders_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(REPO / "examples" / "speculatortrainjob.yaml")
    assert main(["render", example, "--verifier-layers", "8", "--verifier-revision", "s3:abc"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert names[0] == ("PersistentVolumeClaim", "tiny-qwen3-eagle3-workspace")
    jobs = [n for k, n in names if k == "Job"]
    assert jobs == [f"tiny-qwen3-eagle3-{s}" for s in ("fetch", "prepare", "extract", "train", "audit", "publish")]
    assert ("Deployment", "tiny-qwen3-eagle3-verifier") in names  # prepare-data's render endpoint
    assert ("Deployment", "tiny-qwen3-eagle3-extractor") in names
    fetch = next(d for d in docs if d["metadata"]["name"] == "tiny-qwen3-eagle3-fetch")
    args = fetch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--revision") + 1] == "s3:abc"


def test_several_documents_of_both_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both.yaml"
    sdep = (REPO / "examples" / "speculatordeployment.yaml").read_text().split("\n---\n")[0]
    both.write_text(sdep + "\n---\n" + (REPO / "examples" / "speculatortrainjob.yaml").read_text())
    code = main(["render", str(both), "--verifier-layers", "8", "--draft-algorithm", "eagle3", "--draft-tokens", "3"])
    assert code == 0
    kinds = {d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim", "Job"}


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: SpeculatorTrainJob\nmetadata: {name: x}\nspec: {algorithm: medusa}\n")
    assert main(["render", str(bad), "--verifier-layers", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "spec." in err
    pvc = tmp_path / "pvc.yaml"
    pvc.write_text(yaml.safe_dump({"kind": "SpeculatorTrainJob", "metadata": {"name": "x"}, "spec": {
        "verifier": {"model": "pvc://models/q"}, "algorithm": "eagle3", "data": {"sources": ["hf:o/d"]},
        "output": {"uri": "s3://b/x"}}}))  # fmt: skip
    assert main(["render", str(pvc)]) == 2
    assert "--verifier-layers" in capsys.readouterr().err


def _docs(*names: str) -> list[tuple[str, Any]]:
    return [(n, d) for n in names for d in yaml.safe_load_all((GPU / n).read_text()) if d]


def test_an_unreadable_draft_renders_from_the_options_and_says_the_audit_was_not_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = str(GPU / "llama-3.1-8b-eagle3-deployment.yaml")
    assert main(["render", example, "--draft-algorithm", "eagle3", "--draft-tokens", "3"]) == 0
    captured = capsys.readouterr()
    head = captured.out.splitlines()[0]
    assert head.startswith("# SpeculatorDeployment/llama-3.1-8b-eagle3: audit not run: the draft could not be read")
    assert "hf://RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3: ConnectError" in head  # the reason
    assert "audit not run" in captured.err
    docs = list(yaml.safe_load_all(captured.out))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "PodDisruptionBudget"]  # complete
    pod = docs[0]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert (config["method"], config["num_speculative_tokens"]) == ("eagle3", 3)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "speculator-credentials"}}]
    stage = pod["initContainers"][0]["args"]
    assert "--manifest" not in stage  # nothing was audited: no audited file list to hold the pod to


def test_a_plain_render_of_an_unreadable_draft_uses_what_the_manifest_declares(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["render", str(GPU / "qwen3-8b-dflash-deployment.yaml")]) == 0
    captured = capsys.readouterr()
    assert "Rendered from spec.speculator.algorithm dflash and speculativeTokens 7 as declared" in captured.err
    args = next(yaml.safe_load_all(captured.out))["spec"]["template"]["spec"]["containers"][0]["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert (config["method"], config["num_speculative_tokens"]) == ("dflash", 7)
    # the flags win over the declaration
    [rendered] = render_documents(
        _docs("qwen3-8b-dflash-deployment.yaml"), RenderOptions(draft_algorithm="dflash", draft_tokens=5)
    )
    assert "--draft-algorithm dflash --draft-tokens 5" in rendered.said[0]


def test_without_a_declaration_or_the_options_an_unreadable_draft_is_bad_input_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((GPU / "qwen3-8b-dflash-deployment.yaml").read_text())
    del doc["spec"]["speculator"]["speculativeTokens"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(doc))
    assert main(["render", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "audit not run: hf://RedHatAI/Qwen3-8B-speculator.dflash" in err
    assert "spec.speculator.algorithm and speculativeTokens" in err


def test_strict_refuses_to_render_without_the_audit(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(GPU / "qwen3-8b-dflash-deployment.yaml")
    assert main(["render", example, "--draft-algorithm", "dflash", "--draft-tokens", "7", "--strict"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--strict" in captured.err
    trainjob = str(GPU / "qwen3-8b-dflash-trainjob.yaml")
    assert main(["render", trainjob, "--verifier-layers", "36", "--strict"]) == 2


def test_an_unreadable_verifier_renders_with_the_given_layers_and_says_so() -> None:
    [rendered] = render_documents(_docs("qwen3-8b-dflash-trainjob.yaml"), RenderOptions(verifier_layers=36))
    assert rendered.said[0].startswith("verifier not read (hf://Qwen/Qwen3-8B@main: ConnectError")
    assert "its revision is not resolved" in rendered.said[0]
    train = next(d for d in rendered.children if d["metadata"]["name"] == "qwen3-8b-dflash-train")
    args = train["spec"]["template"]["spec"]["containers"][0]["args"]
    # speculators' default layers for 36: [2, 18, 33]; online: the trainer asks the extraction servers
    assert args[args.index("--target-layer-ids") + 1 : args.index("--target-layer-ids") + 4] == ["2", "18", "33"]
    assert "--vllm-endpoint" in args
    # without the flag, the layer count the manifest declares (36) stands in, and the output says so
    [declared] = render_documents(_docs("qwen3-8b-dflash-trainjob.yaml"), RenderOptions())
    assert "rendered with spec.verifier.numHiddenLayers 36 as declared" in declared.said[0]
    assert declared.children == rendered.children
    # with neither, the render cannot choose the layers: bad input naming both ways out
    [(name, doc)] = _docs("qwen3-8b-dflash-trainjob.yaml")
    del doc["spec"]["verifier"]["numHiddenLayers"]
    with pytest.raises(UsageError, match=r"declare spec\.verifier\.numHiddenLayers \(or pass --verifier-layers\)"):
        render_documents([(name, doc)], RenderOptions())


def test_a_readable_verifier_wins_over_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    read = VerifierRef({"num_hidden_layers": 36}, "c0ffee", "hub:abc")
    [rendered] = render_documents(
        _docs("qwen3-8b-dflash-trainjob.yaml"), RenderOptions(verifier_layers=30), read_config=lambda _: read
    )
    assert rendered.said == []
    train = next(d for d in rendered.children if d["metadata"]["name"] == "qwen3-8b-dflash-train")
    args = train["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--target-layer-ids") + 1 : args.index("--target-layer-ids") + 4] == ["2", "18", "33"]
    fetch = next(d for d in rendered.children if d["metadata"]["name"] == "qwen3-8b-dflash-fetch")
    args = fetch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--revision") + 1] == "c0ffee"
    # the verifier read contradicts the declared 36: the output says the operator would stop the job
    read = VerifierRef({"num_hidden_layers": 40}, "c0ffee", "hub:abc")
    [declared] = render_documents(_docs("qwen3-8b-dflash-trainjob.yaml"), RenderOptions(), read_config=lambda _: read)
    assert declared.said == [
        "verifier.numHiddenLayers is 36 but its config.json has num_hidden_layers 40: the operator would stop "
        "this job (Failed, InvalidSpec)."
    ]


def test_a_failed_audit_is_said_and_strict_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, tensors = dflash(block_size=8)
    config = mutate(config, "speculators_config.proposal_methods.0.speculative_tokens", 8)
    local = write_checkpoint(tmp_path / "ck", config, tensors)  # a small broken draft of our own, named as such
    monkeypatch.setattr(render, "audit", lambda _source, **kw: audit(str(local), **kw))
    [rendered] = render_documents(_docs("qwen3-8b-dflash-deployment.yaml"), RenderOptions())
    assert rendered.said[0].startswith("audit failed: 1 error(s), the first speculative-tokens:")
    assert "AuditFailed" in rendered.said[0]
    assert main(["render", str(GPU / "qwen3-8b-dflash-deployment.yaml"), "--strict"]) == 1


def test_a_train_jobs_output_is_served_when_the_job_is_rendered_with_it() -> None:
    docs = _docs("llama-3.1-405b-eagle3-trainjob.yaml", "llama-3.1-405b-multinode-deployment.yaml")
    options = RenderOptions(verifier_layers=126, draft_algorithm="eagle3", draft_tokens=3)
    job, deployment = render_documents(docs, options)
    assert job.kind == "SpeculatorTrainJob"
    assert deployment.said[0].startswith("audit not run: the draft is train job llama-3.1-405b-eagle3's output")
    kinds = [d["kind"] for d in deployment.children]
    assert kinds == ["LeaderWorkerSet", "Service", "PodDisruptionBudget"]
    lws = deployment.children[0]["spec"]
    assert (lws["replicas"], lws["leaderWorkerTemplate"]["size"]) == (1, 2)
    leader = lws["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    stage = leader["initContainers"][0]["args"]
    assert stage[:2] == ["stage", "s3://my-drafts/llama-3.1-405b-eagle3"]
    assert leader["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    with pytest.raises(UsageError, match=r"with train job llama-3\.1-405b-eagle3's manifest beside it"):
        render_documents(_docs("llama-3.1-405b-multinode-deployment.yaml"), options)
    # what the deployment declares stands in for the flags
    assert render_documents(docs, RenderOptions())[1].children == deployment.children


def test_a_folder_renders_every_example_and_skips_the_secret(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--verifier-layers", "32", "--draft-algorithm", "eagle3", "--draft-tokens", "3"]
    assert main(["render", str(GPU), *args]) == 0
    captured = capsys.readouterr()
    assert "skipped Secret/speculator-credentials" in captured.err
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(captured.out)}
    assert {"llama-3.1-8b-eagle3", "qwen3-8b-dflash", "llama-3.1-405b-group", "llama-3.1-8b-eagle3-train"} <= names
    assert main(["render", str(GPU / "credentials-secret.yaml")]) == 2
    assert "no SpeculatorDeployment or SpeculatorTrainJob" in capsys.readouterr().err
