"""The SpeculatorDeployment operator, in-process, against the real control plane and the real S3 server."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from kopf.testing import KopfRunner
from kubernetes import client

from ..ckptgen import eagle3, write_checkpoint
from .conftest import Cluster, eventually

pytestmark = pytest.mark.cluster

SMALL = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
    "vocab_size": 4096,
}  # fmt: skip


@pytest.fixture(scope="module")
def operator(cluster: Cluster, operator_crds: list[str]) -> Iterator[KopfRunner]:
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    args = ["run", "--standalone", "--all-namespaces", "-m", "speculator_operator.controllers"]
    try:
        with KopfRunner(args, timeout=60) as runner:
            yield runner
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
    assert runner.exception is None, runner.exception


@pytest.fixture(scope="module")
def store(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Checkpoints and a verifier config in the real S3 server; returns their URIs."""
    if cluster.s3 is None:
        pytest.skip("no S3 server: the cluster came from KUBECONFIG and AWS_ENDPOINT_URL is not set")
    s3 = boto3.client("s3", endpoint_url=cluster.s3.endpoint, aws_access_key_id=cluster.s3.access_key,
                      aws_secret_access_key=cluster.s3.secret_key, region_name=cluster.s3.region)  # fmt: skip
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    root = tmp_path_factory.mktemp("store")
    good_config, good_tensors = eagle3(SMALL, draft_vocab=1024)
    write_checkpoint(root / "good", good_config, good_tensors, sparse=False)
    bad_tensors = dict(good_tensors)
    bad_tensors["fc.weight"] = ("BF16", [256, 512])  # two aux layers' worth where the config says three
    write_checkpoint(root / "bad", good_config, bad_tensors, sparse=False)
    (root / "verifier").mkdir()
    (root / "verifier" / "config.json").write_text(json.dumps(SMALL))
    for folder in ("good", "bad", "verifier"):
        for f in (root / folder).iterdir():
            s3.upload_file(str(f), bucket, f"{folder}/{f.name}")
    return {"good": f"s3://{bucket}/good", "bad": f"s3://{bucket}/bad", "verifier": f"s3://{bucket}/verifier"}


@pytest.fixture
def creds(cluster: Cluster, namespace: str) -> str:
    assert cluster.s3 is not None
    client.CoreV1Api(cluster.api).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="s3"), string_data=cluster.s3.env()))  # fmt: skip
    return "s3"


def sdep(name: str, store: dict[str, str], draft: str, creds: str, **serving: Any) -> str:
    return json.dumps({
        "apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment", "metadata": {"name": name},
        "spec": {"verifier": {"model": store["verifier"], "credentials": {"name": creds}},
                 "speculator": {"source": store[draft], "credentials": {"name": creds}},
                 "serving": {"replicas": 2, **serving}},
    })  # fmt: skip


def get(cluster: Cluster, namespace: str, what: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "-n", namespace, what, "-o", "json").stdout)  # type: ignore[no-any-return]


def test_audited_draft_is_served_and_ready(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("qwen", store, "good", creds,
                                                                   cutoff={"maxBatchSize": 16}))  # fmt: skip
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/qwen", "--timeout=120s")
    obj = get(cluster, namespace, "sdep/qwen")
    st = obj["status"]
    assert st["phase"] == "Ready"
    assert st["algorithm"] == "eagle3"
    assert st["numSpeculativeTokens"] == 3
    assert st["readyReplicas"] == 2
    assert st["audit"]["ok"] is True
    assert st["verifierRevision"].startswith("etag:")
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Audited"]["status"] == "True"
    assert conds["Ready"]["observedGeneration"] == obj["metadata"]["generation"]

    dep = get(cluster, namespace, "deployment/qwen")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    config = json.loads(c["args"][c["args"].index("--speculative-config") + 1])
    assert config["method"] == "eagle3"
    assert config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 3], [17, 256, 0]]
    assert dep["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    get(cluster, namespace, "service/qwen")
    get(cluster, namespace, "pdb/qwen")
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector="speculators.dev/deployment=qwen"
    )
    assert {p.spec.node_name.rsplit("-", 1)[0] for p in pods.items} == {"kwok-gpu"}

    table = cluster.kubectl("get", "speculators", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "VERIFIER", "ALGORITHM", "K", "VLLM", "READY", "ACCEPTANCE", "AGE"]
    row = table[1].split()
    assert row[:3] == ["qwen", "Ready", store["verifier"]]
    assert row[3:7] == ["eagle3", "3", "0.32.0", "2"]


def test_a_draft_that_fails_its_audit_gets_no_pods(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("broken", store, "bad", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "sdep/broken", "--timeout=120s")
    st = get(cluster, namespace, "sdep/broken")["status"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Audited"]["status"] == "False"
    assert conds["Audited"]["reason"] == "AuditFailed"
    assert "fc-shape" in conds["Audited"]["message"]
    assert any(f["rule"] == "fc-shape" for f in st["audit"]["findings"])
    assert cluster.kubectl("get", "-n", namespace, "deployment/broken", check=False).returncode != 0
    events = eventually(lambda: _events(cluster, namespace, "broken", "AuditFailed"))
    assert "fc-shape" in events[0]["message"]


def _events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    items = get(cluster, namespace, "events")["items"]
    found = [e for e in items if e["involvedObject"].get("name") == name and e["reason"] == reason]
    assert found, f"no {reason} event for {name}"
    return found


def test_spec_change_rolls_out_a_new_revision_and_deletion_collects_children(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("roll", store, "good", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/roll", "--timeout=120s")
    first = get(cluster, namespace, "sdep/roll")["status"]["revision"]
    cluster.kubectl("patch", "-n", namespace, "sdep/roll", "--type=merge",
                    "-p", json.dumps({"spec": {"serving": {"numSpeculativeTokens": 2}}}))  # fmt: skip
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.numSpeculativeTokens}=2", "sdep/roll",
                    "--timeout=120s")  # fmt: skip
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/roll", "--timeout=120s")
    st = get(cluster, namespace, "sdep/roll")["status"]
    assert st["revision"] != first
    dep = get(cluster, namespace, "deployment/roll")
    assert dep["spec"]["template"]["metadata"]["annotations"]["speculators.dev/revision"] == st["revision"]
    assert st["updatedReplicas"] == 2
    cluster.kubectl("delete", "-n", namespace, "sdep/roll")
    for kind in ("deployment", "service", "pdb"):
        cluster.kubectl("wait", "-n", namespace, "--for=delete", f"{kind}/roll", "--timeout=120s")


def test_unreadable_checkpoint_waits_with_a_reason(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    missing = {**store, "missing": store["good"].rsplit("/", 1)[0] + "/not-yet-published"}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("later", missing, "missing", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Pending", "sdep/later", "--timeout=120s")
    conds = {c["type"]: c for c in get(cluster, namespace, "sdep/later")["status"]["conditions"]}
    assert conds["Audited"]["reason"] == "CheckpointUnreadable"
    assert "no such object" in conds["Audited"]["message"]
