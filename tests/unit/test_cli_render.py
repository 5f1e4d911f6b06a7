"""`speculator-operator render`: the GitOps preview of every child, for both kinds, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from speculator_operator.cli import main

REPO = Path(__file__).resolve().parents[2]


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
