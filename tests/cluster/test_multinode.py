"""Verifiers larger than one node: SpeculatorDeployments served by LeaderWorkerSet groups, against the real API
server, the real LeaderWorkerSet controller and its pod webhook (built from sigs.k8s.io/lws and installed by the
harness: hack/harness/src/speculator_harness/lws.py), and kwok pods."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.adapters.checkpoints import read_verifier

from .conftest import SMALL, Cluster, eventually, get, sdep

pytestmark = pytest.mark.cluster

LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
REVISION = "speculators.dev/revision"


def lws_installed(cluster: Cluster) -> bool:
    return cluster.kubectl("get", "crd", LWS_CRD, check=False).returncode == 0


@pytest.fixture(scope="module")
def lws(cluster: Cluster, operator: KopfRunner) -> Iterator[None]:
    """The LeaderWorkerSet controller and webhooks, installed into the running cluster (after the operator started:
    it finds the API without a restart)."""
    if not lws_installed(cluster):
        if cluster.harness is None:
            pytest.skip("the cluster came from KUBECONFIG and has no LeaderWorkerSet CRD")
        cluster.harness.install_lws()
    return


def two_nodes(name: str, store: dict[str, str], creds: str, **serving: Any) -> str:
    doc = json.loads(sdep(name, store, "good", creds, **serving))
    doc["spec"]["serving"].setdefault("parallelism", {"tensor": 2, "nodes": 2})
    return json.dumps(doc)


def pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    found = get(cluster, namespace, "pods")["items"]
    return [p for p in found if p["metadata"]["labels"].get("speculators.dev/deployment") == name]


def rollout_sample(cluster: Cluster, namespace: str) -> tuple[int, int, list[str]]:
    """(the deployment's status.updatedReplicas, then the groups whose every pod is at status.revision, and the pods
    whose rendezvous port is not their revision's). The status is read first: the pods only move forward after it."""
    st = get(cluster, namespace, "sdep/big")["status"]
    found = [p for p in pods(cluster, namespace, "big") if not p["metadata"].get("deletionTimestamp")]
    members: dict[str, set[str]] = {}
    astray = []
    for pod in found:
        labels = pod["metadata"]["labels"]
        members.setdefault(labels[GROUP_KEY], set()).add(labels[REVISION])
        args = pod["spec"]["containers"][0]["args"]
        if args[args.index("--master-port") + 1] != str(29501 + int(labels[REVISION], 16) % 1000):
            astray.append(pod["metadata"]["name"])
    whole = sum(1 for revs in members.values() if revs == {st["revision"]})
    return st.get("updatedReplicas", 0), whole, astray


def conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    st = get(cluster, namespace, f"sdep/{name}").get("status") or {}
    return {c["type"]: c for c in st.get("conditions") or []}


def test_without_the_lws_api_nothing_is_created_and_it_is_found_without_a_restart(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    if lws_installed(cluster):
        pytest.skip("the LeaderWorkerSet CRD is already installed in this cluster: the missing-API path cannot run")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=two_nodes("big", store, creds))

    def unavailable() -> dict[str, dict[str, Any]]:
        conds = conditions(cluster, namespace, "big")
        assert conds.get("Ready", {}).get("reason") == "LeaderWorkerSetUnavailable", conds.get("Ready")
        return conds

    conds = eventually(unavailable, timeout=90)
    assert conds["Ready"]["status"] == "False"
    assert "lws.sigs.k8s.io" in conds["Ready"]["message"]
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("True", "LeaderWorkerSetUnavailable")
    assert pods(cluster, namespace, "big") == []
    assert cluster.kubectl("get", "-n", namespace, "deployment/big", check=False).returncode != 0

    assert cluster.harness is not None
    cluster.harness.install_lws()  # the operator keeps running: no restart, no right on CRDs
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/big", "--timeout=120s")
    assert get(cluster, namespace, "leaderworkerset/big-group")["spec"]["replicas"] == 2
    assert "Stalled" not in conditions(cluster, namespace, "big")


def test_a_two_node_deployment_is_one_group_per_replica_with_ranks_from_the_webhook(
    cluster: Cluster, lws: None, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=two_nodes("big", store, creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/big", "--timeout=120s")
    st = get(cluster, namespace, "sdep/big")["status"]
    assert (st["readyReplicas"], st["updatedReplicas"]) == (2, 2)
    assert cluster.kubectl("get", "-n", namespace, "deployment/big", check=False).returncode != 0
    found = pods(cluster, namespace, "big")
    assert len(found) == 4
    by_key: dict[str, list[dict[str, Any]]] = {}
    for pod in found:
        by_key.setdefault(pod["metadata"]["labels"][GROUP_KEY], []).append(pod)
    assert sorted(len(g) for g in by_key.values()) == [2, 2]
    for members in by_key.values():
        leader = next(p for p in members if p["metadata"]["labels"][WORKER_INDEX] == "0")
        worker = next(p for p in members if p["metadata"]["labels"][WORKER_INDEX] == "1")
        for pod, rank in ((leader, "0"), (worker, "$(LWS_WORKER_INDEX)")):
            (container,) = pod["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in container.get("env") or []}
            # injected by the LeaderWorkerSet pod webhook; the kubelet expands them in the arguments
            assert env["LWS_LEADER_ADDRESS"] == f"{leader['metadata']['name']}.big-group.{namespace}"
            assert env["LWS_GROUP_SIZE"] == "2"
            assert env["LWS_WORKER_INDEX"] == pod["metadata"]["labels"][WORKER_INDEX]
            args = container["args"]
            assert args[args.index("--node-rank") + 1] == rank
            assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
            assert ("--headless" in args) == (pod is worker)
            # every pod stages exactly the audited files and audits them in its entrypoint
            stages = {c["name"]: c for c in pod["spec"]["initContainers"]}
            assert sorted(stages) == ["stage-draft", "stage-verifier"]
            assert stages["stage-draft"]["args"][:2] == ["stage", store["good"]]
            assert all("--manifest" in c["args"] for c in stages.values())
            assert container["command"][:2] == ["speculator-operator", "serve"]
    service = get(cluster, namespace, "service/big")
    assert service["spec"]["selector"]["speculators.dev/role"] == "leader"
    endpoints = get(cluster, namespace, "endpointslices")["items"]
    served = {a["targetRef"]["name"] for s in endpoints if s["metadata"]["labels"].get("kubernetes.io/service-name")
              == "big" for a in s.get("endpoints") or []}  # fmt: skip
    assert served == {p["metadata"]["name"] for p in found if p["metadata"]["labels"][WORKER_INDEX] == "0"}


def test_a_verifier_upgrade_rolls_whole_groups_and_a_worker_restart_recreates_its_group(
    cluster: Cluster, lws: None, store: dict[str, str], namespace: str, creds: str, s3: Any
) -> None:
    bucket = store["verifier"].removeprefix("s3://").split("/")[0]
    verifier = f"s3://{bucket}/v-{namespace}"
    s3.put_object(Bucket=bucket, Key=f"v-{namespace}/config.json", Body=json.dumps(SMALL).encode())
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    input=two_nodes("big", {**store, "verifier": verifier}, creds))  # fmt: skip
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/big", "--timeout=120s")
    old = get(cluster, namespace, "sdep/big")["status"]["revision"]
    generation = get(cluster, namespace, "leaderworkerset/big-group")["metadata"]["generation"]

    s3.put_object(
        Bucket=bucket, Key=f"v-{namespace}/config.json", Body=json.dumps({**SMALL, "rope_theta": 1e6}).encode()
    )
    new_verifier = read_verifier(verifier).revision
    cluster.kubectl("annotate", "-n", namespace, "sdep/big", "speculators.dev/resolve-requested=upgrade")
    # The LeaderWorkerSet updates a group in place, leader first, then its workers: for a moment a group's pods carry
    # two revisions. Such a group is never counted as updated (nor the deployment Ready), and its ranks of two
    # revisions dial two rendezvous ports: they cannot form one engine.
    overcounted: list[tuple[int, int]] = []
    astray: set[str] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        updated, whole, wrong = rollout_sample(cluster, namespace)
        astray.update(wrong)
        if updated > whole:
            overcounted.append((updated, whole))
        st = get(cluster, namespace, "sdep/big")["status"]
        if st.get("verifierRevision") == new_verifier and st["phase"] == "Ready" and st["revision"] != old:
            break
        time.sleep(0.2)
    assert overcounted == []
    assert astray == set()
    st = get(cluster, namespace, "sdep/big")["status"]
    assert (st["verifierRevision"], st["phase"]) == (new_verifier, "Ready")
    assert st["updatedReplicas"] == 2
    assert get(cluster, namespace, "leaderworkerset/big-group")["metadata"]["generation"] == generation + 1
    assert {p["metadata"]["labels"][REVISION] for p in pods(cluster, namespace, "big")} == {st["revision"]}

    leader = get(cluster, namespace, "pod/big-group-0")["metadata"]["uid"]
    cluster.kubectl("delete", "-n", namespace, "pod/big-group-0-1", "--wait=false")

    def recreated() -> None:
        assert get(cluster, namespace, "pod/big-group-0")["metadata"]["uid"] != leader

    # the whole group restarts as a unit; LWS's controller does it, and on a 2-core machine beside CI's other lane it
    # once took more than a minute (alone: seconds)
    eventually(recreated, timeout=180)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/big", "--timeout=120s")


def test_a_layout_the_release_cannot_serve_is_refused_before_any_pod(
    cluster: Cluster, lws: None, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    input=two_nodes("wide", store, creds, parallelism={"tensor": 8, "nodes": 4}))  # fmt: skip

    def refused() -> dict[str, dict[str, Any]]:
        conds = conditions(cluster, namespace, "wide")
        assert conds.get("Ready", {}).get("reason") == "LayoutUnsupported", conds.get("Ready")
        return conds

    conds = eventually(refused, timeout=90)
    assert "maxNodes" in conds["Ready"]["message"]
    assert conds["Stalled"]["status"] == "True"
    assert pods(cluster, namespace, "wide") == []
    assert cluster.kubectl("get", "-n", namespace, "leaderworkerset/wide-group", check=False).returncode != 0


@pytest.mark.parametrize(
    ("serving", "field", "words"),
    [
        ({"tensorParallelSize": 2, "parallelism": {"tensor": 4}}, "spec.serving", "disagree"),
        ({"parallelism": {"tensor": 3, "nodes": 2}}, "spec.serving", "divide the server evenly"),
        ({"parallelism": {"tensor": 1, "data": 3, "nodes": 2}}, "spec.serving", "divide the server evenly"),
    ],
)
def test_impossible_layouts_are_refused_by_the_api_server(
    cluster: Cluster, operator_crds: list[str], store: dict[str, str], namespace: str,
    serving: dict[str, Any], field: str, words: str,
) -> None:  # fmt: skip
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                           input=two_nodes("bad", store, "s3", **serving))  # fmt: skip
    assert done.returncode != 0
    assert field in done.stderr
    assert words in done.stderr
