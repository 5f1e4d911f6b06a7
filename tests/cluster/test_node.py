"""Real pods on the real node, from the images hack/build-images built: the operator installed in-cluster
from its Helm chart reconciles both kinds; a SpeculatorTrainJob's stages run in trainer pods (fetch,
prepare-data, `train --dry-run`, audit, publish to S3) and hand the draft to a SpeculatorDeployment whose
pod stages it, audits it and serves it with the CPU build of the pinned vLLM; faults are reported in the
kubelet's words.

The Helm-installed operator watches only this module's namespace, and no in-process operator runs while
this module does (the `operator` fixture is not used here), so the two never watch the same namespaces.
"""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from speculator_harness import containerd
from speculator_harness.network import kube_proxy_serves
from speculator_operator.api.labels import TRACK_LABEL
from speculator_operator.api.podcontract import PROGRESS_SECONDS_DEFAULT, ServerExit, ServerExitReason
from speculator_operator.domain.releases import DEFAULT_RELEASE, get_release
from speculator_operator.domain.sweep import Curve
from speculator_operator.telemetry.vllm_metrics import parse_sample

from ..lanes import make_tiny_verifier, run_in, workloads_env_path
from .conftest import ARGOCD_DEPLOYMENT, REPO, Cluster, chart_image_values, eventually, get, gitops

pytestmark = [pytest.mark.cluster, pytest.mark.node]
CHART = REPO / "charts" / "speculator-operator"
FULLNAME = "so-speculator-operator"  # the release `so`: every object of the chart is named so (its fullname)
ON_NODE = {
    "nodeSelector": {"speculators.dev/real-node": "true"},
    "tolerations": [{"key": "speculators.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}],
}
# what a CPU needs, through the spec's own fields: the cpu variant of the server image, no GPU, small limits
CPU_SERVING = {
    "replicas": 1,
    "image": get_release().image("server", "cpu"),
    "resources": {"limits": {"nvidia.com/gpu": 0}},
    "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "OMP_NUM_THREADS", "value": "2"}],
    "extraArgs": ["--enforce-eager", "--max-model-len", "512"],
    "maxNumSeqs": 8,
    "cutoff": {"maxBatchSize": 4},
    **ON_NODE,
}


def _helm_env(cluster: Cluster, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(home / "c"),
        "HELM_CONFIG_HOME": str(home / "f"),
        "HELM_DATA_HOME": str(home / "d"),
    }


def helm_popen(cluster: Cluster, home: Path, *args: str) -> subprocess.Popen[str]:
    exe = Path(cluster.kubectl_path).with_name("helm")
    return subprocess.Popen(
        [str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_helm_env(cluster, home)
    )


def helm(cluster: Cluster, home: Path, *args: str) -> str:
    exe = Path(cluster.kubectl_path).with_name("helm")
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, env=_helm_env(cluster, home), timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def node_ns(
    cluster: Cluster, real_node: str, operator_crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A namespace served by the operator that the chart installs on the real node (its own image, its own
    ServiceAccount and ClusterRole), with the S3 credentials its pods and the operator share."""
    assert cluster.s3 is not None
    name = f"node-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    core.create_namespaced_secret(
        name, client.V1Secret(metadata=client.V1ObjectMeta(name="s3"), string_data=cluster.s3.env())
    )
    home = tmp_path_factory.mktemp("helm")
    values = {
        "watchNamespaces": [name],
        "acceptance": {"scrapeIntervalSeconds": 3, "scrapeNetworks": ["10.250.0.0/24"]},
        **ON_NODE,
        **chart_image_values(cluster),
    }
    (home / "values.json").write_text(json.dumps(values))
    helm(
        cluster,
        home,
        "install",
        "so",
        str(CHART),
        "-n",
        name,
        "-f",
        str(home / "values.json"),
        "--skip-crds",
        "--wait",
        "--timeout",
        "180s",
    )
    try:
        yield name
    finally:
        logs = cluster.kubectl("logs", "-n", name, f"deployment/{FULLNAME}", "--tail=200", check=False)
        (home / "operator.log").write_text(logs.stdout + logs.stderr)
        helm(cluster, home, "uninstall", "so", "-n", name, "--wait")
        core.delete_namespace(name)


@pytest.fixture(scope="module")
def models(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny verifier (a real tokenizer and weights vLLM loads) and pretokenized rows, in S3."""
    assert cluster.s3 is not None
    root = tmp_path_factory.mktemp("node-models")
    verifier = make_tiny_verifier(workloads_env_path(), root / "verifier")
    s3 = cluster.s3.client()
    bucket = f"node-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for f in sorted(verifier.iterdir()):
        s3.upload_file(str(f), bucket, f"verifier/{f.name}")
    rows = [
        {"input_ids": [5 + (i * 7 + j) % 500 for j in range(40)], "loss_mask": [0] * 10 + [1] * 30} for i in range(16)
    ]
    s3.put_object(Bucket=bucket, Key="data/rows.jsonl", Body="".join(json.dumps(r) + "\n" for r in rows).encode())
    return {
        "bucket": bucket,
        "verifier": f"s3://{bucket}/verifier",
        "rows": f"s3://{bucket}/data/rows.jsonl",
        "dir": str(verifier),
    }


def workspace_volume(cluster: Cluster, namespace: str, claim: str, make_claim: bool = True) -> None:
    """A ReadWriteMany volume on the node's host, bound in advance to `claim` as an admin would provide one
    (no provisioner runs here); with `make_claim` the claim too (spec.workspace.claimName)."""
    path = Path(f"/tmp/speculator-node-{namespace}-{claim}")
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)  # the pods run as a non-root user; a hostPath volume has no fsGroup
    core = client.CoreV1Api(cluster.api)
    core.create_persistent_volume(
        client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=f"pv-{namespace}-{claim}", labels={"speculators.dev/test": "true"}),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "10Gi"},
                access_modes=["ReadWriteMany"],
                storage_class_name="",
                host_path=client.V1HostPathVolumeSource(path=str(path)),
                claim_ref=client.V1ObjectReference(namespace=namespace, name=claim),
                persistent_volume_reclaim_policy="Retain",
            ),
        )
    )
    if make_claim:
        claim_spec = client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            storage_class_name="",
        )
        body = client.V1PersistentVolumeClaim(metadata=client.V1ObjectMeta(name=claim), spec=claim_spec)
        core.create_namespaced_persistent_volume_claim(namespace, body)


def apply(cluster: Cluster, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    """The node tier names its release, as the demo does: a move of the operator's default changes nothing here."""
    spec = {"release": DEFAULT_RELEASE, **spec}
    doc = {"apiVersion": "speculators.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def list_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "-n", namespace, "pods", "-l", selector, "-o", "json").stdout
    return json.loads(out)["items"]  # type: ignore[no-any-return]


def serving_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found = [
        p
        for p in list_pods(cluster, namespace, f"speculators.dev/deployment={name}")
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert len(found) == 1, [p["metadata"]["name"] for p in found]
    return found[0]


def test_the_chart_runs_the_operator_in_cluster_and_it_reconciles_both_kinds(
    cluster: Cluster, node_ns: str, real_node: str
) -> None:
    dep = get(cluster, node_ns, f"deployment/{FULLNAME}")
    pods = list_pods(cluster, node_ns, "app.kubernetes.io/name=speculator-operator")
    assert len(pods) == 2  # the chart's default: two replicas, one active
    for pod in pods:
        assert pod["spec"]["nodeName"] == real_node  # real pods, from the image built here
        assert pod["spec"]["serviceAccountName"] == FULLNAME
    assert dep["status"]["availableReplicas"] == 2
    holder = eventually(lambda: _lease_holder(cluster, node_ns), timeout=60)
    assert holder.rsplit("_", 1)[0] in {p["metadata"]["name"] for p in pods}
    # the samples, as the README shows them (kwok plays their pods: they ask for GPUs)
    store = f"s3://models-{node_ns}"
    s3 = _s3(cluster)
    s3.create_bucket(Bucket=store.removeprefix("s3://"))
    subprocess.run(
        [sys.executable, str(REPO / "hack" / "demo-assets.py")],
        check=True,
        env={**os.environ, **_aws(cluster), "DEMO_BUCKET": store.removeprefix("s3://")},
        capture_output=True,
        timeout=120,
    )
    # the same sample in a namespace the operator does not watch (its Roles stop at node_ns): left untouched
    unwatched = f"{node_ns}-unwatched"
    cluster.kubectl("create", "namespace", unwatched)
    sample = (REPO / "examples" / "speculatordeployment.yaml").read_text().replace("s3://models/", f"{store}/")
    cluster.kubectl("apply", "-n", unwatched, "-f", "-", input=sample.replace("models-s3", "s3"))
    for example in ("speculatordeployment.yaml", "speculatortrainjob.yaml"):
        text = (REPO / "examples" / example).read_text().replace("s3://models/", f"{store}/")
        cluster.kubectl("apply", "-n", node_ns, "-f", "-", input=text.replace("models-s3", "s3"))
    workspace_volume(cluster, node_ns, "tiny-qwen3-eagle3-workspace", make_claim=False)  # the job makes it
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "sdep/tiny-qwen3", "--timeout=180s")
    cluster.kubectl(
        "wait", "-n", node_ns, "--for=jsonpath={.status.phase}=Failed", "sdep/tiny-qwen3-broken", "--timeout=180s"
    )
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "stj/tiny-qwen3-eagle3", "--timeout=300s")
    for name in ("tiny-qwen3", "tiny-qwen3-broken", "tiny-qwen3-eagle3"):
        cluster.kubectl("delete", "-n", node_ns, f"speculators/{name}", "--wait=true", check=False)
    # by now the operator has reconciled everything it watches; what it does not watch it never touched
    for item in json.loads(cluster.kubectl("get", "speculators", "-n", unwatched, "-o", "json").stdout)["items"]:
        # only the CRD's default (docs/operations/gitops.md): no status was written
        assert item.get("status") == {"observedGeneration": 0}, item["metadata"]["name"]
        annotations = item["metadata"].get("annotations") or {}
        assert not [a for a in annotations if a.startswith("speculators.dev/")], annotations  # no kopf state
    assert cluster.kubectl("get", "deployments,jobs", "-n", unwatched, "-o", "name").stdout.strip() == ""
    cluster.kubectl("delete", "namespace", unwatched, "--wait=false")


def _lease_holder(cluster: Cluster, namespace: str) -> str:
    out = cluster.kubectl("get", "lease", FULLNAME, "-n", namespace, "-o",
                          "jsonpath={.spec.holderIdentity}", check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "nobody holds the Lease"
    return out.stdout.strip()


def test_a_rolling_upgrade_of_the_operator_loses_no_transition(
    cluster: Cluster, node_ns: str, real_node: str, tmp_path: Path
) -> None:
    """`helm upgrade` to a new image tag, on the real node, while a resource changes and another is created:
    the new pods start as standbys, the old holder hands the Lease back as it stops, and every change is
    reconciled once (the running resource's children are the same objects, changed in place)."""
    if cluster.harness is None:
        pytest.skip("needs the local node's containerd to tag the new image")
    old_image = get(cluster, node_ns, f"deployment/{FULLNAME}")["spec"]["template"]["spec"]["containers"][0]
    by_tag, _, digest = old_image["image"].partition("@")  # pinned to the pushed digest where the harness has one
    repository, _, tag = by_tag.rpartition(":")
    new_tag = f"{tag}-upgrade"
    pulled = f"{repository}@{digest}" if digest else by_tag  # the name containerd holds it by
    tagged = containerd.ctr(cluster.harness.workdir, "images", "tag", "--force", pulled,
                            f"{repository}:{new_tag}")  # fmt: skip
    assert tagged.returncode == 0, tagged.stderr
    store = f"s3://models-{node_ns}"
    s3 = _s3(cluster)
    bucket = store.removeprefix("s3://")
    if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=bucket)
        subprocess.run([sys.executable, str(REPO / "hack" / "demo-assets.py")], check=True, capture_output=True,
                       env={**os.environ, **_aws(cluster), "DEMO_BUCKET": bucket}, timeout=120)  # fmt: skip
    sample = (REPO / "examples" / "speculatordeployment.yaml").read_text().replace("s3://models/", f"{store}/")
    first = next(d for d in yaml.safe_load_all(sample.replace("models-s3", "s3")) if d)
    first["metadata"]["name"] = "before-upgrade"
    cluster.kubectl("apply", "-n", node_ns, "-f", "-", input=json.dumps(first))
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "sdep/before-upgrade", "--timeout=180s")
    revision = get(cluster, node_ns, "sdep/before-upgrade")["status"]["revision"]
    child_uid = get(cluster, node_ns, "deployment/before-upgrade")["metadata"]["uid"]
    holder = _lease_holder(cluster, node_ns)

    home = tmp_path / "helm"
    home.mkdir()
    upgrade = helm_popen(cluster, home, "upgrade", "so", str(CHART), "-n", node_ns, "--reuse-values", "--set",
                         f"image.tag={new_tag}", "--skip-crds", "--wait", "--timeout", "300s")  # fmt: skip
    # changes made while the replicas are being replaced
    patch = {"spec": {"serving": {"extraArgs": ["--enforce-eager"]}}}
    cluster.kubectl("patch", "-n", node_ns, "sdep/before-upgrade", "--type=merge", "-p", json.dumps(patch))
    second = json.loads(json.dumps(first))
    second["metadata"]["name"] = "during-upgrade"
    cluster.kubectl("apply", "-n", node_ns, "-f", "-", input=json.dumps(second))
    _, err = upgrade.communicate(timeout=400)
    assert upgrade.returncode == 0, err

    pods = list_pods(cluster, node_ns, "app.kubernetes.io/name=speculator-operator")
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    new_image = f"{repository}:{new_tag}" + (f"@{digest}" if digest else "")
    assert {p["spec"]["containers"][0]["image"] for p in live} == {new_image}

    def new_holder() -> str:
        now = _lease_holder(cluster, node_ns)
        assert now != holder
        assert now.rsplit("_", 1)[0] in {p["metadata"]["name"] for p in live}, now
        return now

    eventually(new_holder, timeout=120)

    def rolled() -> None:
        status = get(cluster, node_ns, "sdep/before-upgrade").get("status") or {}
        assert status.get("revision") not in (None, revision), status
        assert status.get("phase") == "Ready", status

    eventually(rolled, timeout=240)
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "sdep/during-upgrade", "--timeout=240s")
    assert get(cluster, node_ns, "deployment/before-upgrade")["metadata"]["uid"] == child_uid  # changed in place
    assert get(cluster, node_ns, "deployment/during-upgrade")["metadata"]["labels"]["speculators.dev/deployment"]
    lease = get(cluster, node_ns, f"lease/{FULLNAME}")
    assert int(lease["spec"]["leaseTransitions"]) >= 1
    for name in ("before-upgrade", "during-upgrade"):
        cluster.kubectl("delete", "-n", node_ns, f"sdep/{name}", "--wait=true", check=False)


def _aws(cluster: Cluster) -> dict[str, str]:
    assert cluster.s3 is not None
    return cluster.s3.env()


def _s3(cluster: Cluster) -> Any:
    assert cluster.s3 is not None
    return cluster.s3.client()


def test_a_train_job_in_real_pods_publishes_a_draft_that_a_real_pod_serves(
    cluster: Cluster, node_ns: str, models: dict[str, str], real_node: str
) -> None:
    workspace_volume(cluster, node_ns, "ws")
    creds = {"name": "s3"}
    apply(
        cluster,
        node_ns,
        "SpeculatorTrainJob",
        "tiny",
        {
            "verifier": {"model": models["verifier"], "credentials": creds},
            "algorithm": "eagle3",
            "data": {"sources": [models["rows"]], "format": "pretokenized", "seqLength": 256},
            "training": {"dryRun": True, "epochs": 1},
            "workspace": {"claimName": "ws"},
            "output": {"uri": f"s3://{models['bucket']}/drafts", "credentials": creds},
            "retries": 0,
            "stages": {"cpu": ON_NODE, "trainer": ON_NODE},
        },
    )
    apply(
        cluster,
        node_ns,
        "SpeculatorDeployment",
        "tiny",
        {
            "verifier": {"model": models["verifier"], "credentials": creds},
            "speculator": {"fromTrainJob": "tiny"},
            "serving": CPU_SERVING,
        },
    )
    t0 = time.monotonic()
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "stj/tiny", "--timeout=900s", timeout=960)
    published = time.monotonic() - t0
    job = get(cluster, node_ns, "stj/tiny")["status"]
    assert [s["name"] for s in job["stages"]] == ["fetch", "prepare", "train", "audit", "publish"]
    stage_pods = list_pods(cluster, node_ns, "speculators.dev/trainjob=tiny")
    assert {p["spec"]["nodeName"] for p in stage_pods} == {real_node}  # every stage ran in a real pod
    assert job["checkpoint"]["uri"].startswith(f"s3://{models['bucket']}/drafts/sha256-")
    assert job["progress"]["samplesTotal"] == 16  # the stage pods' termination messages reached the operator
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "sdep/tiny", "--timeout=900s", timeout=960)
    served = time.monotonic() - t0
    st = get(cluster, node_ns, "sdep/tiny")["status"]
    assert st["draftSource"] == job["checkpoint"]["uri"]
    # the pinned tuple is whole: the kubelet ran exactly the builds the harness pushed, by their digests
    pushed = cluster.local.image_digests if cluster.local is not None else {}
    assert pushed, "the harness pushed no image to the node's registry"
    server = pushed[get_release().reference("server", "cpu")]
    assert st["servedImage"]["revision"] == st["revision"]
    assert st["servedImage"]["image"].endswith(f"@{server}"), st["servedImage"]
    assert st["servedImage"]["imageId"].endswith(f"@{server}"), st["servedImage"]
    trainer = pushed[get_release().reference("trainer")]
    assert job["provenance"]["images"]["train"].endswith(f"@{trainer}"), job["provenance"]
    pod = serving_pod(cluster, node_ns, "tiny")
    assert pod["spec"]["nodeName"] == real_node
    log = cluster.kubectl("logs", "-n", node_ns, pod["metadata"]["name"], "-c", "vllm").stdout
    assert "serve: audit ok" in log
    # a completion through the Service (once kube-proxy answers its ClusterIP), and real spec-decode counters
    ip = get(cluster, node_ns, "service/tiny")["spec"]["clusterIP"]
    eventually(lambda: _assert(kube_proxy_serves(ip), f"kube-proxy has not programmed {ip} yet"), timeout=60)

    # the in-cluster operator scrapes the pod's metrics: a first scrape before any request is the baseline
    def counted() -> dict[str, Any]:
        acc = get(cluster, node_ns, "sdep/tiny")["status"].get("acceptance") or {}
        assert (acc.get("pods") or {}).get("counted") == 1, acc
        return acc

    eventually(counted, timeout=60)
    out = post(f"http://{ip}:8000/v1/completions", {"model": "tiny", "prompt": "the verifier", "max_tokens": 16})
    assert out["choices"][0]["text"]
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    drafted = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:spec_decode_num_draft_tokens_total{")
    ]
    assert drafted
    assert sum(drafted) > 0
    drafts = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:spec_decode_num_drafts_total{")
    )

    # the operator counts exactly what vLLM counted since the baseline (min samples not reached yet): its live
    # count, every scrape, is vLLM's; status.acceptance is written when a figure moves materially, and the drafts
    # count alone does not (telemetry/acceptance.py), so a scrape that lands mid-request leaves it lower
    def scraped() -> dict[str, Any]:
        acc = counted()
        assert _operator_drafts(cluster, node_ns, "tiny") == drafts, (acc, drafts)
        assert 0 < acc.get("drafts", 0) <= int(drafts), (acc, drafts)
        return acc

    acc = eventually(scraped, timeout=60)
    assert 0.0 <= acc["rate"] <= 1.0
    assert 1.0 <= acc["meanAcceptedLength"] <= acc["k"] + 1
    assert len(acc["perPosition"]) == acc["k"]
    effective = next(
        c for c in get(cluster, node_ns, "sdep/tiny")["status"]["conditions"] if c["type"] == "SpeculationEffective"
    )
    assert (effective["status"], effective["reason"]) == ("Unknown", "NotEnoughSamples")
    print(f"train job apply -> published {published:.0f} s, -> served (real pod Ready) {served:.0f} s")


def _assert(condition: bool, message: str) -> None:
    assert condition, message


def test_a_killed_serving_pod_comes_back_and_the_pair_stays_coherent(cluster: Cluster, node_ns: str) -> None:
    before = get(cluster, node_ns, "sdep/tiny")["status"]
    old = serving_pod(cluster, node_ns, "tiny")["metadata"]["name"]
    cluster.kubectl("delete", "-n", node_ns, f"pod/{old}", "--wait=false")

    def back() -> dict[str, Any]:
        pod = serving_pod(cluster, node_ns, "tiny")
        assert pod["metadata"]["name"] != old
        st = get(cluster, node_ns, "sdep/tiny")["status"]
        assert st["revision"] == before["revision"]  # the same pair: never a mismatched one
        assert pod["metadata"]["labels"]["speculators.dev/revision"] == before["revision"]
        assert st["phase"] == "Ready", st["phase"]
        return pod

    eventually(back, timeout=600, interval=2)


def test_a_verifier_change_rolls_the_real_pods(cluster: Cluster, node_ns: str, models: dict[str, str]) -> None:
    before = get(cluster, node_ns, "sdep/tiny")["status"]
    cluster.kubectl(
        "patch",
        "-n",
        node_ns,
        "sdep/tiny",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"upgradePolicy": {"pollIntervalSeconds": 30}}}),
    )
    # a compatible change of the verifier in place: its generation defaults
    config = json.loads(Path(models["dir"], "generation_config.json").read_text())
    s3 = _s3(cluster)
    s3.put_object(
        Bucket=models["bucket"],
        Key="verifier/generation_config.json",
        Body=json.dumps({**config, "temperature": 0.5}).encode(),
    )

    def rolled() -> dict[str, Any]:
        st = get(cluster, node_ns, "sdep/tiny")["status"]
        assert st["verifierRevision"] != before["verifierRevision"]
        assert st["phase"] == "Ready", st["phase"]
        pod = serving_pod(cluster, node_ns, "tiny")
        assert pod["metadata"]["labels"]["speculators.dev/revision"] == st["revision"]
        return st

    st = eventually(rolled, timeout=900, interval=3)
    assert st["revision"] != before["revision"]


def test_an_image_the_node_cannot_get_is_reported_in_the_kubelets_words(
    cluster: Cluster, node_ns: str, models: dict[str, str], bin_dir: Path
) -> None:
    missing = get_release().image("server", "cpu") + "-missing"
    apply(
        cluster,
        node_ns,
        "SpeculatorDeployment",
        "noimage",
        {
            "verifier": {"model": models["verifier"], "credentials": {"name": "s3"}},
            "speculator": {"fromTrainJob": "tiny"},
            "serving": {**CPU_SERVING, "image": missing},
        },
    )

    def reported() -> dict[str, Any]:
        status = get(cluster, node_ns, "sdep/noimage").get("status") or {}  # none until the operator's first pass
        conds = {c["type"]: c for c in status.get("conditions", [])}
        assert conds.get("Serving", {}).get("reason") in ("ErrImagePull", "ImagePullBackOff"), conds.get("Serving")
        return conds["Serving"]

    serving = eventually(reported, timeout=180, interval=2)
    assert missing in serving["message"]
    # the harness's registry answered: the tag is not there (not a closed port, not a refused connection)
    assert "not found" in serving["message"], serving["message"]
    assert "connection refused" not in serving["message"], serving["message"]
    # a rollout stuck on its image is Stalled: Failed for kstatus (Helm's and Flux's waits end), Degraded for Argo CD
    obj = get(cluster, node_ns, "sdep/noimage")
    stalled = {c["type"]: c for c in obj["status"]["conditions"]}["Stalled"]
    assert stalled["reason"] in ("ErrImagePull", "ImagePullBackOff")
    assert gitops(bin_dir, "kstatus", objects=[obj])[0]["status"] == "Failed"
    assert gitops(bin_dir, "health", str(ARGOCD_DEPLOYMENT), objects=[obj])[0]["status"] == "Degraded"
    cluster.kubectl("delete", "-n", node_ns, "sdep/noimage")


def test_a_server_whose_engine_exits_is_reported_with_the_entrypoints_reason(
    cluster: Cluster, node_ns: str, models: dict[str, str]
) -> None:
    """The cpu server image's real vLLM refuses a context longer than the tiny verifier's and exits at start-up: the
    entrypoint leaves its exit record as the termination message and the operator shows the record's reason (on a
    CUDA image without a GPU the same path says NoAccelerator: the images tier runs that one)."""
    serving = {**CPU_SERVING, "extraArgs": ["--enforce-eager", "--max-model-len", "100000"]}
    apply(
        cluster,
        node_ns,
        "SpeculatorDeployment",
        "noengine",
        {
            "verifier": {"model": models["verifier"], "credentials": {"name": "s3"}},
            "speculator": {"fromTrainJob": "tiny"},
            "serving": serving,
        },
    )

    def reported() -> dict[str, Any]:
        status = get(cluster, node_ns, "sdep/noengine").get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions", [])}
        assert conds.get("Serving", {}).get("reason") == ServerExitReason.ENGINE_EXITED, conds.get("Serving")
        return conds["Serving"]

    serving_condition = eventually(reported, timeout=300, interval=2)
    assert serving_condition["status"] == "False"
    pod = serving_pod(cluster, node_ns, "noengine")
    (status,) = [cs for cs in pod["status"]["containerStatuses"] if cs["name"] == "vllm"]
    term = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
    record = ServerExit.decode(term["message"])
    assert record is not None
    assert (record.platform, record.exit_code) == ("cpu", term["exitCode"])
    cluster.kubectl("delete", "-n", node_ns, "sdep/noengine")


def test_an_oom_killed_stage_is_reported_with_that_reason(
    cluster: Cluster, node_ns: str, models: dict[str, str]
) -> None:
    workspace_volume(cluster, node_ns, "ws-oom")
    # prepare-data imports torch, transformers and datasets: far more than this
    small = {**ON_NODE, "resources": {"limits": {"memory": "96Mi"}}}
    apply(
        cluster,
        node_ns,
        "SpeculatorTrainJob",
        "oom",
        {
            "verifier": {"model": models["verifier"], "credentials": {"name": "s3"}},
            "algorithm": "eagle3",
            "data": {"sources": [models["rows"]], "format": "pretokenized", "seqLength": 256},
            "training": {"dryRun": True},
            "workspace": {"claimName": "ws-oom"},
            "output": {"uri": f"s3://{models['bucket']}/oom", "credentials": {"name": "s3"}},
            "retries": 0,
            "stages": {"cpu": small, "trainer": ON_NODE},
        },
    )
    cluster.kubectl("wait", "-n", node_ns, "--for=jsonpath={.status.phase}=Failed", "stj/oom", "--timeout=300s")
    st = get(cluster, node_ns, "stj/oom")["status"]
    assert st["stage"] in ("fetch", "prepare")
    assert "OOMKilled (exit code 137)" in {c["type"]: c for c in st["conditions"]}["Failed"]["message"]


@pytest.fixture(scope="module")
def known_pair(cluster: Cluster, models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A verifier whose greedy choice is always token 0 and two drafts that always propose token 0 (agree)
    or token 1 (disagree), made with the real speculators (hack/lib/known_acceptance_pair.py), in S3."""
    root = tmp_path_factory.mktemp("known-pair")
    run_in(workloads_env_path(), "python", str(REPO / "hack" / "lib" / "known_acceptance_pair.py"), str(root))
    s3 = _s3(cluster)
    out = {}
    for name in ("verifier", "agree", "disagree"):
        for f in sorted((root / name).iterdir()):
            if f.is_file():
                s3.upload_file(str(f), models["bucket"], f"known/{name}/{f.name}")
        out[name] = f"s3://{models['bucket']}/known/{name}"
    return out


def _vllm_counters(ip: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=10) as resp:
        sample = parse_sample(resp.read().decode())
    return {
        "drafts": sample.drafts,
        "draft_tokens": sample.draft_tokens,
        "accepted": sample.accepted,
        "per_position": sample.per_position,
    }


def _operator_drafts(cluster: Cluster, namespace: str, name: str = "known") -> float | None:
    """The in-cluster operator's own live count of the drafts in the window (its /metrics, every scrape;
    the status is written only when a value moves materially)."""
    active = _lease_holder(cluster, namespace).rsplit("_", 1)[0]  # the replica that runs the controllers
    pods = list_pods(cluster, namespace, "app.kubernetes.io/name=speculator-operator")
    (pod,) = [p for p in pods if p["metadata"]["name"] == active]
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8081/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "speculator_acceptance_drafts" and s.labels == {"namespace": namespace, "name": name}:
                return float(s.value)
    return None


def _judged(cluster: Cluster, namespace: str, counters: dict[str, Any], verdict: tuple[str, str]) -> dict[str, Any]:
    assert _operator_drafts(cluster, namespace) == counters["drafts"]  # all of vLLM's drafts, counted once
    st = get(cluster, namespace, "sdep/known")["status"]
    acc = st.get("acceptance") or {}
    assert acc.get("revision") == st["revision"], acc
    assert 0 < acc.get("drafts", 0) <= counters["drafts"], (acc, counters)  # written when a value moved
    cond = next(c for c in st["conditions"] if c["type"] == "SpeculationEffective")
    assert (cond["status"], cond["reason"]) == verdict, cond
    return acc


def test_real_vllm_acceptance_of_an_agreeing_and_a_disagreeing_draft(
    cluster: Cluster, node_ns: str, known_pair: dict[str, str]
) -> None:
    """Real numbers from real vLLM: the drafts' acceptance is known by construction (1 and 0); the operator's
    status, condition, events and per-position acceptance follow vLLM's own counters. Then a canary of each draft
    against the other, judged on those counters (_canaries)."""
    cluster.kubectl("delete", "-n", node_ns, "sdep/tiny", "--ignore-not-found", "--wait=true", timeout=300)
    serving = {
        **CPU_SERVING,
        "env": [*CPU_SERVING["env"], {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
        "tuning": {"minSamples": 20, "windowSeconds": 600},
    }
    spec = {
        "verifier": {"model": known_pair["verifier"], "credentials": {"name": "s3"}},
        "speculator": {"source": known_pair["agree"], "credentials": {"name": "s3"}},
        "serving": serving,
    }
    apply(cluster, node_ns, "SpeculatorDeployment", "known", spec)
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "sdep/known", "--timeout=900s", timeout=960)
    k = get(cluster, node_ns, "sdep/known")["status"]["numSpeculativeTokens"]

    def measure(verdict: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
        pod = serving_pod(cluster, node_ns, "known")
        ip = pod["status"]["podIP"]
        # the operator's first scrape of this pod, before any request, is its baseline
        eventually(lambda: _counted_revision(cluster, node_ns, pod), timeout=60)
        for i in range(3):
            body = {
                "model": "known",
                "prompt": f"the verifier {i}",
                "max_tokens": 48,
                "temperature": 0,
                "ignore_eos": True,
            }
            post(f"http://{ip}:8000/v1/completions", body)
        counters = _vllm_counters(ip)
        return counters, eventually(lambda: _judged(cluster, node_ns, counters, verdict), timeout=60)

    counters, acc = measure(("True", "AboveBreakEven"))
    assert counters["accepted"] == counters["draft_tokens"] == k * counters["drafts"] > 0  # vLLM: all accepted
    assert acc["rate"] == 1.0
    assert acc["meanAcceptedLength"] == k + 1
    assert acc["perPosition"] == [round(v / counters["drafts"], 4) for v in counters["per_position"]] == [1.0] * k
    assert acc["predictedSpeedup"] > 1

    # the disagreeing draft swapped in: a new revision, judged afresh, below break-even
    swapped = time.monotonic()
    spec["speculator"]["source"] = known_pair["disagree"]
    before = get(cluster, node_ns, "sdep/known")["status"]["revision"]
    apply(cluster, node_ns, "SpeculatorDeployment", "known", spec)

    def rolled() -> None:
        st = get(cluster, node_ns, "sdep/known")["status"]
        assert st["revision"] != before
        assert st["phase"] == "Ready", st["phase"]
        assert (
            serving_pod(cluster, node_ns, "known")["metadata"]["labels"]["speculators.dev/revision"] == st["revision"]
        )

    eventually(rolled, timeout=900, interval=3)
    counters, acc = measure(("False", "BelowBreakEven"))
    collapsed = time.monotonic() - swapped
    assert counters["accepted"] == 0
    assert counters["drafts"] > 0
    assert acc["rate"] == 0.0
    assert acc["meanAcceptedLength"] == 1.0
    assert acc["perPosition"] == [0.0] * k
    assert acc["predictedSpeedup"] < 1
    # one event for each transition of SpeculationEffective
    events = [e for e in get(cluster, node_ns, "events")["items"] if e["involvedObject"].get("name") == "known"]
    by_reason = {r: [e for e in events if e.get("reason") == r] for r in ("AboveBreakEven", "BelowBreakEven")}
    assert [(e["type"], e.get("count", 1)) for e in by_reason["AboveBreakEven"]] == [("Normal", 1)]
    assert [(e["type"], e.get("count", 1)) for e in by_reason["BelowBreakEven"]] == [("Warning", 1)]
    print(f"disagreeing draft applied -> rolled out, served and judged BelowBreakEven: {collapsed:.0f} s")
    # the same object, now the disagreeing draft's, under a canary policy (one server start fewer than a new one)
    _canaries(cluster, node_ns, spec, known_pair, "known")
    cluster.kubectl("delete", "-n", node_ns, "sdep/known", "--wait=true", timeout=300)


def _canaries(cluster: Cluster, node_ns: str, spec: dict[str, Any], known_pair: dict[str, str], name: str) -> None:
    """1 replica plus 1 canary of the real CPU vLLM, the known-acceptance pair, traffic from a bounded client here:
    the disagreeing incumbent loses to an agreeing candidate (promoted: the main Deployment rolls once), then the
    agreeing incumbent beats a disagreeing candidate (rolled back: no rollout, both figures in status)."""
    # an interval counts with 10 drafts a side; one interval decides
    spec["upgradePolicy"] = {"canary": {"intervalSeconds": 10, "minDrafts": 10, "promoteAfter": 1, "rollbackAfter": 1}}
    incumbent = get(cluster, node_ns, f"sdep/{name}")["status"]
    generation = get(cluster, node_ns, f"deployment/{name}")["metadata"]["generation"]

    def verdict(state: str) -> dict[str, Any]:
        """Both sides' pods asked in turn (a bounded client: one completion at a time, for at most 15 minutes)
        until the canary reaches `state`."""
        cluster.kubectl("wait", "-n", node_ns, "--for=jsonpath={.status.canary.state}=Analyzing", f"sdep/{name}",
                        "--timeout=120s", timeout=180)  # fmt: skip
        deadline = time.monotonic() + 900
        i = 0
        while True:
            st = get(cluster, node_ns, f"sdep/{name}")["status"]
            canary = st.get("canary") or {}
            if canary.get("state") == state:
                return st
            assert canary.get("state") == "Analyzing", canary
            assert time.monotonic() < deadline, canary
            # the two sides' pods: not one of an earlier canary that the garbage collector is taking away (the
            # promoted revision's, on the canary track)
            sides = {"": st["revision"], "canary": canary["candidate"]["revision"]}
            ready = [p for p in list_pods(cluster, node_ns, f"speculators.dev/deployment={name}")
                     if any(c.get("ready") for c in p["status"].get("containerStatuses") or [])
                     and not p["metadata"].get("deletionTimestamp")
                     and sides[p["metadata"]["labels"].get(TRACK_LABEL, "")]
                     == p["metadata"]["labels"].get("speculators.dev/revision")]  # fmt: skip
            for pod in ready:
                body = {
                    "model": name,
                    "prompt": f"traffic {i}",
                    "max_tokens": 32,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                try:
                    post(f"http://{pod['status']['podIP']}:8000/v1/completions", body)
                except (urllib.error.URLError, ConnectionError) as exc:
                    # a verdict may have come meanwhile and its canary's pod be stopping: an error from any other
                    # pod is a failure
                    if _stopping(cluster, node_ns, pod["metadata"]["name"]):
                        continue
                    said = exc.read()[:500] if isinstance(exc, urllib.error.HTTPError) else b""
                    raise AssertionError(f"{pod['metadata']['name']}: {exc} {said!r}") from exc
                i += 1
            if not ready:
                time.sleep(2)

    # an agreeing candidate beside a disagreeing incumbent: promoted, one rollout of the main Deployment
    spec["speculator"]["source"] = known_pair["agree"]
    apply(cluster, node_ns, "SpeculatorDeployment", name, spec)
    st = verdict("Promoting")
    candidate = st["canary"]["candidate"]
    assert candidate["alpha"] > st["canary"]["incumbent"]["alpha"]
    cluster.kubectl("wait", "-n", node_ns, "--for=jsonpath={.status.canary.state}=Promoted", f"sdep/{name}",
                    "--timeout=900s", timeout=960)  # fmt: skip
    st = get(cluster, node_ns, f"sdep/{name}")["status"]
    assert st["revision"] == candidate["revision"] != incumbent["revision"]
    assert get(cluster, node_ns, f"deployment/{name}")["metadata"]["generation"] == generation + 1
    assert (
        cluster.kubectl("get", "-n", node_ns, f"deployment/{name}-canary", "--ignore-not-found", "-o", "name").stdout
        == ""
    )

    # a disagreeing candidate beside the agreeing incumbent: rolled back, no rollout, both figures said
    promoted, generation = st, generation + 1
    spec["speculator"]["source"] = known_pair["disagree"]
    apply(cluster, node_ns, "SpeculatorDeployment", name, spec)
    st = verdict("RolledBack")
    canary = st["canary"]
    assert canary["candidate"]["alpha"] < canary["incumbent"]["alpha"]
    assert canary["candidate"]["drafts"] >= 10
    assert canary["incumbent"]["drafts"] >= 10
    assert st["revision"] == promoted["revision"]
    reasons = {c["type"]: (c["status"], c["reason"], c["message"]) for c in st["conditions"]}
    assert reasons["DraftCurrent"][:2] == ("False", "CanaryRejected")
    assert str(canary["candidate"]["alpha"]) in reasons["DraftCurrent"][2]
    assert str(canary["incumbent"]["alpha"]) in reasons["DraftCurrent"][2]
    assert reasons["Ready"][:2] == ("True", "Ready")
    assert get(cluster, node_ns, f"deployment/{name}")["metadata"]["generation"] == generation
    eventually(
        lambda: _is_empty(cluster.kubectl("get", "-n", node_ns, f"deployment/{name}-canary", "--ignore-not-found",
                                          "-o", "name").stdout),
        timeout=60,
    )  # fmt: skip


def _stopping(cluster: Cluster, namespace: str, pod: str) -> bool:
    out = cluster.kubectl("get", "-n", namespace, f"pod/{pod}", "--ignore-not-found", "-o", "json").stdout
    return not out.strip() or bool(json.loads(out)["metadata"].get("deletionTimestamp"))


def _is_empty(text: str) -> None:
    assert text.strip() == "", text


def _counted_revision(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> None:
    acc = get(cluster, namespace, "sdep/known")["status"].get("acceptance") or {}
    assert acc.get("revision") == pod["metadata"]["labels"]["speculators.dev/revision"], acc
    assert (acc.get("pods") or {}).get("counted") == 1, acc


def _rows(agree: bool) -> bytes:
    """Pretokenized rows for the known verifier (greedy: always token 0). A dry-run draft for it has a zero LM
    head too (copied from the verifier), so it always proposes draft token 0, which its vocabulary map sends
    to the smallest target id among the data's most frequent tokens: token 0 where the answers are full of
    it (the draft agrees), another one where 0 never occurs (it disagrees)."""
    rows = []
    for i in range(16):
        if agree:
            answer = [0 if j % 2 else 7 + (i + j) % 300 for j in range(30)]
        else:
            answer = [1 + (i * 37 + j * 13) % 511 for j in range(30)]
        rows.append(
            {"input_ids": [5 + (i * 7 + j) % 500 for j in range(10)] + answer, "loss_mask": [0] * 10 + [1] * 30}
        )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_the_evaluate_stage_publishes_an_agreeing_draft_and_refuses_a_disagreeing_one(
    cluster: Cluster, node_ns: str, known_pair: dict[str, str], models: dict[str, str], real_node: str
) -> None:
    """Two train jobs on the known verifier, trained (dry run) on data that makes their drafts agree with it
    or not; each is evaluated by the pinned vLLM (CPU build) in a real pod before anything is published."""
    s3 = _s3(cluster)
    bucket, creds = models["bucket"], {"name": "s3"}
    cpu_server = {
        "image": get_release().image("server", "cpu"),
        "resources": {"limits": {"nvidia.com/gpu": 0}},
        "env": [{"name": "OMP_NUM_THREADS", "value": "2"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
        **ON_NODE,
    }
    t0 = time.monotonic()
    for name in ("agree", "disagree"):
        s3.put_object(Bucket=bucket, Key=f"evaluated/{name}.jsonl", Body=_rows(name == "agree"))
        workspace_volume(cluster, node_ns, f"ws-{name}")
        spec = {
            "verifier": {"model": known_pair["verifier"], "credentials": creds},
            "algorithm": "eagle3",
            "draft": {"draftVocabSize": 256},
            "data": {"sources": [f"s3://{bucket}/evaluated/{name}.jsonl"], "format": "pretokenized", "seqLength": 256},
            "training": {"dryRun": True, "epochs": 1},
            "hiddenStates": {"extraArgs": ["--enforce-eager", "--max-model-len", "512"]},
            "evaluation": {"minAcceptance": 0.5, "heldOut": 4, "maxTokens": 16, "timeoutSeconds": 900},
            "workspace": {"claimName": f"ws-{name}"},
            "output": {"uri": f"s3://{bucket}/evaluated-{name}", "credentials": creds},
            "retries": 0,
            "stages": {"cpu": ON_NODE, "trainer": ON_NODE, "server": cpu_server},
        }
        if name == "agree":  # the passing draft is swept too: a server per K in real pods, the curve published
            spec["evaluation"]["sweep"] = {"maxConcurrency": 4, "rounds": 1, "timeoutSeconds": 900}
        apply(cluster, node_ns, "SpeculatorTrainJob", f"eval-{name}", spec)
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "stj/eval-agree", "--timeout=1200s", timeout=1260)
    cluster.kubectl(
        "wait",
        "-n",
        node_ns,
        "--for=jsonpath={.status.phase}=Failed",
        "stj/eval-disagree",
        "--timeout=600s",
        timeout=660,
    )
    took = time.monotonic() - t0

    passed = get(cluster, node_ns, "stj/eval-agree")["status"]
    assert [s["name"] for s in passed["stages"]] == ["fetch", "prepare", "train", "audit", "evaluate", "sweep-k",
                                                     "sweep-half", "sweep-plain", "publish"]  # fmt: skip
    assert passed["progress"]["samplesTotal"] == 12  # 16 rows, 4 held out before training
    ev = passed["evaluation"]
    assert (ev["outcome"], ev["rate"], ev["prompts"], ev["tokens"]) == ("Passed", 1.0, 4, 64)
    assert passed["provenance"]["evaluation"] == ev
    location = passed["checkpoint"]["uri"]
    assert location.startswith(f"s3://{bucket}/evaluated-agree/sha256-")
    key = location.removeprefix(f"s3://{bucket}/") + "/speculators-provenance.json"
    record = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert record["evaluation"]["rate"] == 1.0  # the published record carries the measure
    # and the sweep: every K and concurrency measured on this node's CPU, the whole curve beside the draft
    swept = ev["sweep"]
    assert swept["device"] == "cpu"
    assert swept["ks"] == [ev["k"], -(-ev["k"] // 2)]
    assert [b["concurrency"] for b in swept["best"]] == [1, 2, 4]
    curve = Curve.from_wire(record["sweep"])
    assert curve.digest() == swept["digest"]
    assert all(p.tokens == p.requests * 16 for p in curve.points)

    def servers_gone() -> None:  # each server goes once its stage is done (the last one as the publish starts)
        for role in ("evaluator", "sweeper-half", "sweeper-plain"):
            selector = f"speculators.dev/trainjob=eval-agree,speculators.dev/stage={role}"
            assert list_pods(cluster, node_ns, selector) == [], role

    eventually(servers_gone, timeout=120)

    refused = get(cluster, node_ns, "stj/eval-disagree")["status"]
    failed = {c["type"]: c for c in refused["conditions"]}["Failed"]
    assert failed["reason"] == "AcceptanceBelowThreshold", failed
    assert "below minAcceptance 0.5" in failed["message"]
    assert "nothing was published" in failed["message"]
    assert refused["evaluation"]["rate"] == 0.0
    assert refused["evaluation"]["drafts"] > 0
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="evaluated-disagree/")
    assert listed.get("KeyCount", 0) == 0  # nothing published
    publish = next(s for s in refused["stages"] if s["name"] == "publish")
    assert publish["phase"] == "Pending"

    def seconds(stage: dict[str, Any], key: str) -> float:
        return time.mktime(time.strptime(stage[key], "%Y-%m-%dT%H:%M:%SZ"))

    stages = {s["name"]: s for s in passed["stages"]}
    wall = seconds(stages["evaluate"], "completionTime") - seconds(stages["audit"], "completionTime")
    print(
        f"\nevaluate on the real node (CPU build): stage {wall:.0f} s from the audit's end (server start "
        f"included), client {ev['seconds']} s, {ev['tokens']} tokens over {ev['prompts']} prompts; "
        f"both jobs applied -> judged {took:.0f} s"
    )
    sweep_wall = seconds(stages["sweep-plain"], "completionTime") - seconds(stages["evaluate"], "completionTime")
    print(f"sweep on the real node: {sweep_wall:.0f} s for {len(curve.points)} points, two more server starts included")


def _rfc3339(stamp: str) -> float:
    """Seconds since the epoch of kubectl's --timestamps (RFC 3339 in UTC, nanoseconds, trailing zeros cut)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds + (float(f"0.{fraction}") if fraction else 0.0)


def _operator_progress_writes(cluster: Cluster, namespace: str) -> float:
    """The in-cluster operators' own count of their progress writes to train jobs (their /metrics; only the
    leader writes)."""
    total = 0.0
    for pod in list_pods(cluster, namespace, "app.kubernetes.io/name=speculator-operator"):
        if pod["status"].get("phase") != "Running":
            continue
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8081/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                wanted = {"kind": "SpeculatorTrainJob", "cause": "progress"}
                if s.name == "speculator_status_writes_total" and s.labels == wanted:
                    total += float(s.value)
    return total


def test_a_real_regenerate_stage_moves_the_status_within_the_write_bound(
    cluster: Cluster, node_ns: str, models: dict[str, str], real_node: str
) -> None:
    """speculators' regenerate-responses, for real, against the job's verifier server (vLLM CPU build) in a
    real pod: status.progress.samples moves while the stage runs, the in-cluster operator writes progress at
    most once per interval (SPECULATOR_PROGRESS_SECONDS, 10 s by default), and the lag from the pod's progress
    line to the status is measured."""
    s3 = _s3(cluster)
    bucket, creds = models["bucket"], {"name": "s3"}
    # 96 prompts keep the stage running over 40 s here, for at least two progress writes an interval apart; the
    # README's figures are at SPECULATOR_REGENERATE_PROMPTS=160
    n = int(os.environ.get("SPECULATOR_REGENERATE_PROMPTS", "96"))
    prompts = [{"conversations": [{"role": "user", "content": f"tell me about the number {i}"}]} for i in range(n)]
    body = "".join(json.dumps(p) + "\n" for p in prompts).encode()
    s3.put_object(Bucket=bucket, Key="progress/prompts.jsonl", Body=body)
    workspace_volume(cluster, node_ns, "ws-progress")
    cpu_server = {
        "image": get_release().image("server", "cpu"),
        "resources": {"limits": {"nvidia.com/gpu": 0}},
        "env": [{"name": "OMP_NUM_THREADS", "value": "2"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
        **ON_NODE,
    }
    spec = {
        "verifier": {"model": models["verifier"], "credentials": creds},
        "algorithm": "eagle3",
        "data": {
            "regenerate": {
                "dataset": f"s3://{bucket}/progress/prompts.jsonl",
                "limit": n,
                "maxTokens": 64,
                "concurrency": 1,
            },
            "seqLength": 256,
        },
        "hiddenStates": {"extraArgs": ["--enforce-eager", "--max-model-len", "512"]},
        "training": {"dryRun": True, "epochs": 1},
        "workspace": {"claimName": "ws-progress"},
        "output": {"uri": f"s3://{bucket}/progress-drafts", "credentials": creds},
        "retries": 0,
        "stages": {"cpu": ON_NODE, "trainer": ON_NODE, "server": cpu_server},
    }
    apply(cluster, node_ns, "SpeculatorTrainJob", "progress", spec)

    def regenerating() -> dict[str, Any]:
        st = get(cluster, node_ns, "stj/progress").get("status") or {}
        assert st.get("stage") == "regenerate", st.get("stage")
        assert (st.get("progress") or {}).get("stage") == "regenerate", st.get("progress")
        return st

    eventually(regenerating, timeout=900, interval=1)
    before = _operator_progress_writes(cluster, node_ns)
    t0 = time.monotonic()
    seen: dict[int, float] = {}  # samples -> when the status first showed it (wall clock)
    while time.monotonic() - t0 < 600:
        st = get(cluster, node_ns, "stj/progress").get("status") or {}
        if st.get("stage") != "regenerate":
            break
        samples = (st.get("progress") or {}).get("samples")
        if isinstance(samples, int) and samples not in seen:
            seen[samples] = time.time()
        time.sleep(0.5)
    ran = time.monotonic() - t0
    written = _operator_progress_writes(cluster, node_ns) - before
    assert len(seen) >= 2, f"the status showed {sorted(seen)} over {ran:.0f} s"  # it moved while the stage ran
    assert sorted(seen) == list(seen)  # and only forwards
    # at most one progress write per interval (and one on either edge): the operator in the pod reads every
    # SPECULATOR_PROGRESS_SECONDS, which its chart leaves at the contract's default
    assert written <= ran / PROGRESS_SECONDS_DEFAULT + 2, f"{written} progress writes in {ran:.0f} s"
    pods = list_pods(cluster, node_ns, "speculators.dev/trainjob=progress,speculators.dev/stage=regenerate")
    assert {p["spec"]["nodeName"] for p in pods} == {real_node}
    # the lag: from the pod's progress line (its log's own timestamps) to the status showing its count
    logs = cluster.kubectl("logs", "-n", node_ns, pods[0]["metadata"]["name"], "--timestamps").stdout
    printed: dict[int, float] = {}
    for line in logs.splitlines():
        stamp, _, text = line.partition(" ")
        if text.startswith("speculators-progress "):
            samples = json.loads(text.removeprefix("speculators-progress ")).get("samples")
            when = _rfc3339(stamp)
            if isinstance(samples, int):
                printed.setdefault(samples, when)
    lags = [seen[s] - printed[s] for s in seen if s in printed]
    assert lags, (sorted(seen), sorted(printed))
    cluster.kubectl("wait", "-n", node_ns, "--for=condition=Ready", "stj/progress", "--timeout=900s", timeout=960)
    print(
        f"\nprogress of a real regenerate stage: {len(seen)} distinct sample counts in status over {ran:.0f} s, "
        f"{written:.0f} progress writes ({60 * written / ran:.1f}/min); lag pod line -> status: "
        f"median {sorted(lags)[len(lags) // 2]:.1f} s, max {max(lags):.1f} s"
    )
