"""imagePullSecrets: read once from the operator's settings (SPECULATOR_IMAGE_PULL_SECRETS, set by the chart from
its `imagePullSecrets`) and carried by every pod spec the operator renders: serving pods (a group's leader and
workers too), every stage Job, the extraction and evaluation servers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.render import training
from speculator_operator.render.serving import Draft, Inputs, render
from speculator_operator.runtime import settings
from speculator_operator.runtime.settings import PULL_SECRETS_ENV, Settings, SettingsError

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("registry-creds", "mirror.example")


def pod_specs(children: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every pod spec among rendered children: a Deployment's or Job's template, a LeaderWorkerSet's two."""
    for child in children:
        spec = child.get("spec") or {}
        if child["kind"] in ("Deployment", "Job"):
            yield spec["template"]["spec"]
        elif child["kind"] == "LeaderWorkerSet":
            tpl = spec["leaderWorkerTemplate"]
            yield tpl["leaderTemplate"]["spec"]
            yield tpl["workerTemplate"]["spec"]


def serving_children(pull_secrets: tuple[str, ...], **serving: Any) -> list[dict[str, Any]]:
    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "s3://m/verifier"}, "speculator": {"source": "s3://m/draft"}, "serving": serving}
    )
    inputs = Inputs("qwen", "ns", spec, get_release(), Draft("eagle3", 3, "d" * 40), "v" * 40, "uid-1",
                    pull_secrets=pull_secrets)  # fmt: skip
    return render(inputs).children


def training_children(pull_secrets: tuple[str, ...]) -> list[dict[str, Any]]:
    spec = SpeculatorTrainJobSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B"},
            "algorithm": "eagle3",
            "data": {"sources": ["hf:HuggingFaceH4/ultrachat_200k"]},
            "hiddenStates": {"mode": "online"},
            "evaluation": {},
            "output": {"uri": "s3://drafts/qwen3-8b"},
        }
    )
    inputs = training.Inputs("run", "ml", spec, get_release(), "abc123", 36, "uid-1", pull_secrets=pull_secrets)
    return training.render_all(inputs)


@pytest.mark.parametrize("serving", [{}, {"replicas": 2, "parallelism": {"tensor": 8, "nodes": 2}}])
def test_every_serving_pod_names_the_pull_secrets(serving: dict[str, Any]) -> None:
    pods = list(pod_specs(serving_children(SECRETS, **serving)))
    assert pods, "no pod rendered"
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "registry-creds"}, {"name": "mirror.example"}]
    # none configured: the field is absent (an unchanged render for every install without them)
    assert all("imagePullSecrets" not in pod for pod in pod_specs(serving_children((), **serving)))


def test_every_training_pod_names_the_pull_secrets() -> None:
    children = training_children(SECRETS)
    pods = list(pod_specs(children))
    kinds = {c["kind"] for c in children}
    assert {"Job", "Deployment"} <= kinds  # the stage Jobs and the servers (extraction, evaluation)
    assert len(pods) >= 6
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "registry-creds"}, {"name": "mirror.example"}]
    assert all("imagePullSecrets" not in pod for pod in pod_specs(training_children(())))


def test_the_setting_is_a_comma_separated_list_of_secret_names() -> None:
    assert Settings.from_env({}) == Settings(image_pull_secrets=())
    parsed = Settings.from_env({PULL_SECRETS_ENV: " registry-creds, ,mirror.example,registry-creds"})
    assert parsed.image_pull_secrets == SECRETS  # blanks dropped, duplicates once, the order kept
    with pytest.raises(SettingsError, match=PULL_SECRETS_ENV) as refused:
        Settings.from_env({PULL_SECRETS_ENV: "ok,Not_A_Name"})
    assert "Not_A_Name" in str(refused.value)
    assert "ok," not in str(refused.value)


def test_the_operator_reads_them_once_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "_current", None)
    assert settings.current() == Settings()  # nothing loaded: the defaults
    monkeypatch.setenv(PULL_SECRETS_ENV, "registry-creds")
    assert settings.load().image_pull_secrets == ("registry-creds",)
    monkeypatch.setenv(PULL_SECRETS_ENV, "changed-later")
    assert settings.current().image_pull_secrets == ("registry-creds",)  # read at start, not again


def test_the_render_command_takes_them_as_the_operator_does(tmp_path: Path) -> None:
    manifest = {
        "apiVersion": "speculators.dev/v1alpha1",
        "kind": "SpeculatorDeployment",
        "metadata": {"name": "qwen"},
        "spec": {"verifier": {"model": "Qwen/Qwen3-8B", "revision": "main"},
                 "speculator": {"source": "hf://acme/draft"}},
    }  # fmt: skip
    path = tmp_path / "sdep.yaml"
    path.write_text(yaml.safe_dump(manifest))

    def run(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "speculator_operator.cli", "render", str(path), "--draft-algorithm", "eagle3",
                "--draft-tokens", "3", *flags]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)

    by_flag = run("--image-pull-secret", "registry-creds", "--image-pull-secret", "mirror.example")
    assert by_flag.returncode == 0, by_flag.stderr
    deployment = next(d for d in yaml.safe_load_all(by_flag.stdout) if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "registry-creds"},
        {"name": "mirror.example"},
    ]
    by_env = run(env={PULL_SECRETS_ENV: "registry-creds"})
    assert by_env.returncode == 0, by_env.stderr
    deployment = next(d for d in yaml.safe_load_all(by_env.stdout) if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]
    refused = run("--image-pull-secret", "Bad_Name")
    assert refused.returncode == 2
    assert PULL_SECRETS_ENV in refused.stderr


def test_the_operator_refuses_to_start_on_a_malformed_setting() -> None:
    argv = [sys.executable, "-m", "speculator_operator.cli", "run", "-A", "--skip-permission-check"]
    env = {**os.environ, PULL_SECRETS_ENV: "regcred,Not_A_Name", "KUBECONFIG": "/nonexistent"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert PULL_SECRETS_ENV in out.stderr
    assert "Not_A_Name" in out.stderr
