"""The Helm chart with the built helm, against the real API server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO, Cluster

pytestmark = pytest.mark.cluster
CHART = REPO / "charts" / "speculator-operator"


def helm(cluster: Cluster, tmp_path: Path, *args: str) -> str:
    exe = Path(cluster.kubectl_path).with_name("helm")
    if not exe.exists():
        pytest.skip(f"no helm beside {cluster.kubectl_path}")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "c"),
           "HELM_CONFIG_HOME": str(tmp_path / "f"), "HELM_DATA_HOME": str(tmp_path / "d")}  # fmt: skip
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_chart_lints_and_renders_into_objects_the_api_server_accepts(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    helm(cluster, tmp_path, "lint", str(CHART), "--strict")
    manifest = helm(cluster, tmp_path, "template", "so", str(CHART), "-n", namespace, "--include-crds")
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest)
    for kind in ("serviceaccount/speculator-operator", "clusterrole.rbac.authorization.k8s.io/so-speculator-operator",
                 "deployment.apps/speculator-operator", "customresourcedefinition.apiextensions.k8s.io/"
                 "speculatordeployments.speculators.dev"):  # fmt: skip
        assert kind in out.stdout


def test_installed_chart_grants_what_the_operator_uses_and_no_more(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    release = f"so-{namespace[-6:]}"
    helm(cluster, tmp_path, "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "90s")
    sa = f"system:serviceaccount:{namespace}:speculator-operator"

    def can(verb: str, resource: str, *extra: str) -> bool:
        out = cluster.kubectl("auth", "can-i", verb, resource, "--as", sa, "-A", *extra, check=False)
        return out.stdout.strip() == "yes"

    needed = [
        ("watch", "speculatordeployments.speculators.dev"), ("patch", "speculatordeployments.speculators.dev/status"),
        ("create", "deployments.apps"), ("patch", "services"), ("delete", "poddisruptionbudgets.policy"),
        ("get", "secrets"), ("create", "events"),
        ("watch", "speculatortrainjobs.speculators.dev"), ("patch", "speculatortrainjobs.speculators.dev/status"),
        ("create", "speculatortrainjobs.speculators.dev"), ("create", "jobs.batch"), ("list", "pods"),
        ("create", "persistentvolumeclaims"), ("delete", "deployments.apps"), ("list", "replicasets.apps"),
        ("watch", "pods"),
    ]  # fmt: skip
    for verb, resource in needed:
        assert can(verb, resource), f"the operator cannot {verb} {resource}"
    for verb, resource in [("list", "secrets"), ("create", "pods"), ("delete", "nodes"), ("*", "*"),
                           ("delete", "persistentvolumeclaims"), ("delete", "jobs.batch"),
                           ("delete", "replicasets.apps"),
                           ("create", "clusterroles.rbac.authorization.k8s.io")]:  # fmt: skip
        assert not can(verb, resource), f"the operator may {verb} {resource}, which it does not need"
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Available", "deployment/speculator-operator",
                    "--timeout=90s")  # fmt: skip
    helm(cluster, tmp_path, "uninstall", release, "-n", namespace, "--wait")
