"""Shipping, on the real node: `hack/release` pushes the built images and the chart to the harness's own registry
(on loopback: plain HTTP), and `helm install oci://…` of that chart brings the operator up from the pushed image by
digest, both replicas Ready (the standby passes its readinessProbe). Two releases on disjoint namespaces run side
by side, each reconciling its own; a release on objects another one watches is refused (exit 5, its words in the
pod's termination message).

Run (after hack/build-images): SPECULATOR_REQUIRE_NODE=1 SPECULATOR_BIN_DIR=$(hack/build-kube --print-bin-dir)
python -m pytest tests/cluster/test_release.py"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from speculator_operator.domain.releases import get_release, operator_reference
from speculator_operator.runtime.peers import EXIT_OVERLAP

from .conftest import REPO, Cluster, chart_image_values, eventually, get, missing, node_required
from .test_node import CHART, ON_NODE, helm, list_pods

pytestmark = [pytest.mark.cluster, pytest.mark.node]


@pytest.fixture(scope="module")
def released(cluster: Cluster, real_node: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What `hack/release --no-build 127.0.0.1:PORT/release-test` printed: each image by digest, the chart."""
    assert cluster.local is not None
    if not cluster.local.registry:
        missing("the real node runs no registry", node_required())
    # a path of its own (the harness mirrors ghcr.io under speculator-operator/); the layers are the same blobs,
    # mounted from the harness's repositories rather than sent again
    target = f"{cluster.local.registry}/release-test"
    home = tmp_path_factory.mktemp("release")
    env = {**os.environ, "HELM": str(Path(cluster.kubectl_path).with_name("helm")),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}  # fmt: skip
    out = subprocess.run([str(REPO / "hack" / "release"), "--no-build", target], capture_output=True, text=True,
                         env=env, timeout=1800, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    lines = out.stdout.split()
    images = dict(line.split("@", 1) for line in lines if not line.startswith("oci://"))
    chart = next(line for line in lines if line.startswith("oci://"))
    reference, _, chart_digest = chart.partition("@")
    url, _, version = reference.rpartition(":")
    return {"target": target, "images": images, "chart": url, "version": version, "chart_digest": chart_digest}


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[Any]:
    """Namespaces made on demand, deleted afterwards."""
    core = client.CoreV1Api(cluster.api)
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
        made.append(name)
        return name

    yield make
    for name in made:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def operator_pods(cluster: Cluster, namespace: str, release: str) -> list[dict[str, Any]]:
    pods = list_pods(cluster, namespace, f"app.kubernetes.io/instance={release}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_released_chart_runs_the_operator_from_the_pushed_image_by_digest(
    cluster: Cluster, real_node: str, operator_crds: list[str], released: dict[str, Any], ns: Any, tmp_path: Path
) -> None:
    target = released["target"]
    release = get_release()
    tag = operator_reference().rsplit(":", 1)[1]
    pushed_operator = f"{target}/operator:{tag}"
    assert released["images"][pushed_operator].startswith("sha256:")
    assert f"{target}/trainer:{release.reference('trainer').rsplit(':', 1)[1]}" in released["images"]
    assert released["chart_digest"].startswith("sha256:")
    home = tmp_path / "helm"
    where = ns("oci")
    values = {"watchNamespaces": [where], **ON_NODE}
    (tmp_path / "values.json").write_text(json.dumps(values))
    notes = helm(cluster, home, "install", "shipped", released["chart"], "--version", released["version"],
                 "--plain-http", "-n", where, "-f", str(tmp_path / "values.json"), "--skip-crds", "--wait",
                 "--timeout", "240s")  # fmt: skip
    try:
        assert "shipped-speculator-operator" in notes
        digest = released["images"][pushed_operator]
        pods = operator_pods(cluster, where, "shipped")
        assert len(pods) == 2
        for pod in pods:
            assert pod["spec"]["nodeName"] == real_node
            assert pod["spec"]["containers"][0]["image"] == f"{pushed_operator}@{digest}"
            assert pod["status"]["containerStatuses"][0]["imageID"].endswith(digest)  # what the kubelet ran
            assert ready(pod), pod["status"]  # the standby too: its readinessProbe passes while it waits
        holder = get(cluster, where, "lease/shipped-speculator-operator")["spec"]["holderIdentity"]
        assert holder.rsplit("_", 1)[0] in {p["metadata"]["name"] for p in pods}
        # the pods it renders are pinned to the pushed digests, named under the registry
        env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
        assert env["SPECULATOR_IMAGE_REPOSITORY"] == target
        pinned = json.loads(env["SPECULATOR_IMAGE_DIGESTS"])
        assert pinned == {ref: d for ref, d in released["images"].items() if ref != pushed_operator}
    finally:
        helm(cluster, home, "uninstall", "shipped", "-n", where, "--wait")


def test_two_releases_on_disjoint_namespaces_side_by_side_and_one_on_the_same_objects_refused(
    cluster: Cluster, real_node: str, operator_crds: list[str], ns: Any, tmp_path: Path
) -> None:
    ops, team_a, team_b, other = ns("ops"), ns("team-a"), ns("team-b"), ns("other")
    home = tmp_path / "helm"
    installed: list[str] = []

    def install(release: str, watch: list[str], wait: bool = True) -> None:
        values = {"watchNamespaces": watch, **ON_NODE, **chart_image_values(cluster)}
        (tmp_path / f"{release}.json").write_text(json.dumps(values))
        flags = ["--wait", "--timeout", "180s"] if wait else []
        helm(cluster, home, "install", release, str(CHART), "-n", ops, "-f", str(tmp_path / f"{release}.json"),
             "--skip-crds", *flags)  # fmt: skip
        installed.append(release)

    try:
        install("rel-a", [team_a])
        install("rel-b", [team_b])
        pods = {r: {p["metadata"]["name"] for p in operator_pods(cluster, ops, r)} for r in ("rel-a", "rel-b")}
        for r in ("rel-a", "rel-b"):  # two Leases, each held by a pod of its own release
            holder = get(cluster, ops, f"lease/{r}-speculator-operator")["spec"]["holderIdentity"]
            assert holder.rsplit("_", 1)[0] in pods[r]
        doc = {"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment", "metadata": {"name": "d"},
               "spec": {"verifier": {"model": "pvc://nowhere/verifier"},
                        "speculator": {"source": "pvc://nowhere/draft"}}}  # fmt: skip
        for where in (team_a, team_b, other):
            cluster.kubectl("apply", "-n", where, "-f", "-", input=json.dumps(doc))

        def reconciled(where: str) -> None:
            assert (get(cluster, where, "sdep/d").get("status") or {}).get("conditions"), f"{where}: no status yet"

        # each namespace by its own release: rel-a's Roles grant nothing in team-b, rel-b's nothing in team-a
        for where in (team_a, team_b):
            eventually(lambda w=where: reconciled(w), timeout=120)
        logs_a = cluster.kubectl("logs", "-n", ops, "deployment/rel-a-speculator-operator", "--all-containers",
                                 check=False).stdout  # fmt: skip
        assert team_b not in logs_a
        # the namespace neither watches: untouched (only the CRD's default status)
        assert (get(cluster, other, "sdep/d").get("status") or {}).get("conditions") is None

        # a third release on team-a's objects (newer, named namespaces), and an all-namespaces one: refused
        for release, watch in (("rel-c", [team_a]), ("rel-all", [])):
            install(release, watch, wait=False)

            def refused(r: str = release) -> str:
                for pod in operator_pods(cluster, ops, r):
                    for status in pod.get("status", {}).get("containerStatuses") or []:
                        for state in (status.get("state") or {}, status.get("lastState") or {}):
                            done = state.get("terminated")
                            if done and done.get("exitCode") == EXIT_OVERLAP:
                                assert not ready(pod)
                                return str(done.get("message") or "")
                raise AssertionError(f"{r}: no pod has exited {EXIT_OVERLAP} yet")

            message = eventually(refused, timeout=180)
            assert f"Lease {ops}/rel-a-speculator-operator" in message, message
        assert (
            get(cluster, ops, "lease/rel-a-speculator-operator")["spec"]["holderIdentity"].rsplit("_", 1)[0]
            in (pods["rel-a"])
        )  # the running release kept its objects
    finally:
        for release in reversed(installed):
            helm(cluster, home, "uninstall", release, "-n", ops, "--wait")
