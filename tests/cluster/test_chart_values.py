"""The chart's values, through the built helm: every object named from the fullname (two releases share none,
fullnameOverride names them all), a misspelt value refused by values.schema.json, the Kubernetes versions it
accepts, imagePullSecrets for the operator's pod and (through its setting) for the pods it renders, and a
readinessProbe on the endpoint a standby serves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from speculator_operator.runtime.settings import PULL_SECRETS_ENV

from .conftest import Cluster, helm_beside
from .test_helm_chart import CHART, helm

pytestmark = pytest.mark.cluster


def helm_result(cluster: Cluster, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = helm_beside(cluster)
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "c"), "HELM_CONFIG_HOME": str(tmp_path / "f"),
           "HELM_DATA_HOME": str(tmp_path / "d")}  # fmt: skip
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=180)


def objects(cluster: Cluster, tmp_path: Path, release: str, *flags: str) -> list[dict[str, Any]]:
    out = helm(cluster, tmp_path, "template", release, str(CHART), "-n", "ops", *flags)
    return [d for d in yaml.safe_load_all(out) if d]


def names(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs}


def operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")


def test_every_object_is_named_from_the_fullname_and_two_releases_share_none(cluster: Cluster, tmp_path: Path) -> None:
    flags = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
             "--set", "metrics.dashboard.enabled=true"]  # fmt: skip
    first, second = objects(cluster, tmp_path, "team-a", *flags), objects(cluster, tmp_path, "team-b", *flags)
    assert not names(first) & names(second)  # side by side in one namespace: nothing shared
    for release, docs in (("team-a", first), ("team-b", second)):
        fullname = f"{release}-speculator-operator"
        assert {n for _, _, n in names(docs)} <= {fullname, f"{fullname}-metrics", f"{fullname}-leader",
                                                  f"{fullname}-dashboard"}  # fmt: skip
        args = operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--lease-name={fullname}" in args  # the Lease too: two releases never share one
    # a release whose name holds the chart's: that name alone; fullnameOverride: exactly that name
    assert ("Deployment", "ops", "speculator-operator") in names(objects(cluster, tmp_path, "speculator-operator"))
    custom = objects(cluster, tmp_path, "so", "--set", "fullnameOverride=ml-ops", *flags)
    assert {n for _, _, n in names(custom)} == {"ml-ops", "ml-ops-metrics", "ml-ops-leader", "ml-ops-dashboard"}
    pod = operator_deployment(custom)["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "ml-ops"
    assert "--lease-name=ml-ops" in pod["spec"]["containers"][0]["args"]
    # nameOverride: the app.kubernetes.io/name label and the fullname's second half
    renamed = objects(cluster, tmp_path, "so", "--set", "nameOverride=drafts")
    assert ("Deployment", "ops", "so-drafts") in names(renamed)
    assert operator_deployment(renamed)["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "drafts"
    # a long release name still gives a Service name within 63 characters
    long = objects(cluster, tmp_path, "a" * 50)
    service = next(d for d in long if d["kind"] == "Service")["metadata"]["name"]
    assert len(service) <= 63
    assert service.endswith("-metrics")


@pytest.mark.parametrize(
    "misspelt",
    ["image.repo=x", "watchNamespace[0]=ml", "leaderElection.leaseName=shared", "metrics.serviceMonitor.enable=true",
     "imagePullSecrets[0].nmae=regcred", "replica=3", "image.digest=abc"],
)  # fmt: skip
def test_a_misspelt_or_malformed_value_is_refused(cluster: Cluster, tmp_path: Path, misspelt: str) -> None:
    out = helm_result(cluster, tmp_path, "template", "so", str(CHART), "--set", misspelt)
    assert out.returncode != 0, f"--set {misspelt} was accepted"
    assert "schema" in out.stderr.lower(), out.stderr
    key = misspelt.split("=")[0].split(".")[-1].split("[")[0]
    assert key in out.stderr, out.stderr


def test_the_chart_names_the_kubernetes_versions_it_works_on(cluster: Cluster, tmp_path: Path) -> None:
    old = helm_result(cluster, tmp_path, "template", "so", str(CHART), "--kube-version", "1.28.9")
    assert old.returncode != 0
    assert "kubeVersion" in old.stderr or "incompatible" in old.stderr, old.stderr
    for version in ("1.29.0", "v1.33.1-eks-1234"):
        ok = helm_result(cluster, tmp_path, "template", "so", str(CHART), "--kube-version", version)
        assert ok.returncode == 0, ok.stderr


def test_pull_secrets_reach_the_operators_pod_and_the_pods_it_renders(cluster: Cluster, tmp_path: Path) -> None:
    docs = objects(cluster, tmp_path, "so", "--set", "imagePullSecrets[0].name=regcred",
                   "--set", "imagePullSecrets[1].name=mirror")  # fmt: skip
    pod = operator_deployment(docs)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[PULL_SECRETS_ENV] == "regcred,mirror"  # the operator's setting (runtime/settings.py)
    plain = operator_deployment(objects(cluster, tmp_path, "so"))["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in plain
    assert PULL_SECRETS_ENV not in {e["name"] for e in plain["containers"][0]["env"]}


def test_the_readiness_probe_asks_the_endpoint_a_standby_serves(cluster: Cluster, tmp_path: Path) -> None:
    """A standby answers the --liveness URL while it waits for the Lease (runtime/leader.py StandbyHealth,
    test_side_by_side.py asks a real one), and the holder's kopf serves the same URL: the probe must ask that."""
    container = operator_deployment(objects(cluster, tmp_path, "so"))["spec"]["template"]["spec"]["containers"][0]
    liveness = next(a for a in container["args"] if a.startswith("--liveness="))
    port = int(liveness.rsplit(":", 1)[1].split("/")[0])
    path = "/" + liveness.rsplit(":", 1)[1].split("/", 1)[1]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == path
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[probe["port"]] == port
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"  # a refusal's words in the pod status
