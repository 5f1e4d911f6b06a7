"""The SpeculatorDeployment operator, in-process, against the real control plane and the real S3 server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner
from kubernetes import client

from .conftest import ARGOCD_DEPLOYMENT, SMALL, Cluster, eventually, existing_claim, get, gitops, sdep

pytestmark = pytest.mark.cluster


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
    assert st["verifierRevision"].startswith("s3:")
    assert st["draftRevision"].startswith("s3:")
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
    columns = ["NAME", "PHASE", "VERIFIER", "ALGORITHM", "K", "VLLM", "READY", "ACCEPTANCE", "EFFECTIVE", "AGE"]
    assert table[0].split() == columns
    row = table[1].split()
    # the category holds two kinds, so kubectl names each row with its kind
    assert row[:3] == ["speculatordeployment.speculators.dev/qwen", "Ready", store["verifier"]]
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


def test_a_draft_of_another_kind_than_declared_fails_its_audit(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    """The good EAGLE-3 draft (K 3) under a spec that declares a DFlash draft with K 7: the kind is an error, K a
    warning, and no pod is made."""
    doc = json.loads(sdep("swapped", store, "good", creds))
    doc["spec"]["speculator"] |= {"algorithm": "dflash", "speculativeTokens": 7}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "sdep/swapped", "--timeout=120s")
    st = get(cluster, namespace, "sdep/swapped")["status"]
    assert {c["type"]: c for c in st["conditions"]}["Audited"]["reason"] == "AuditFailed"
    declared = {(f["severity"], f["message"]) for f in st["audit"]["findings"] if f["rule"] == "declared-draft"}
    assert declared == {
        ("error", "speculator.algorithm is dflash but the checkpoint is eagle3"),
        ("warning", "speculator.speculativeTokens is 7 but the checkpoint's is 3: auto serves the checkpoint's"),
    }
    assert cluster.kubectl("get", "-n", namespace, "deployment/swapped", check=False).returncode != 0


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


def test_verifier_changes_follow_the_upgrade_policy(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any,
    bin_dir: Path,
) -> None:  # fmt: skip
    assert cluster.s3 is not None
    s3 = cluster.s3.client()
    bucket = store["verifier"].removeprefix("s3://").split("/")[0]
    cases = {"compatible": "Redeploy", "incompatible": "Redeploy", "paused": "Pause", "retrain": "Retrain"}
    # what the retraining publishes (kwok runs no trainer): a good draft under a new prefix
    retrained = f"retrained-{namespace}"
    for obj in s3.list_objects_v2(Bucket=bucket, Prefix="good/")["Contents"]:
        s3.copy({"Bucket": bucket, "Key": obj["Key"]}, bucket, f"{retrained}/{obj['Key'].split('/', 1)[1]}")
    # the retraining's workspace: a claim on a volume provided in advance
    existing_claim(cluster, namespace, workspace, "retrain-ws")
    report = {"annotations": {"speculators.dev/simulate-message": json.dumps({"speculatorsReport": 1})}}
    template = {"algorithm": "eagle3", "data": {"sources": [store["data"]], "format": "pretokenized"},
                "output": {"uri": f"s3://{bucket}/{retrained}", "credentials": {"name": creds}},
                "workspace": {"claimName": "retrain-ws"}, "retries": 0,
                "stages": {"cpu": report}}  # fmt: skip
    manifests = {}
    for name, policy in cases.items():
        s3.put_object(Bucket=bucket, Key=f"v-{namespace}-{name}/config.json", Body=json.dumps(SMALL).encode())
        doc = json.loads(sdep(name, {**store, "verifier": f"s3://{bucket}/v-{namespace}-{name}"}, "good", creds))
        doc["spec"]["upgradePolicy"] = {"onVerifierChange": policy, "pollIntervalSeconds": 30}
        if policy == "Retrain":
            doc["spec"]["upgradePolicy"]["trainTemplate"] = template
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
        manifests[name] = doc
    before = {}
    for name in cases:
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"sdep/{name}", "--timeout=120s")
        before[name] = get(cluster, namespace, f"sdep/{name}")["status"]
    # the verifier moves: a harmless new key for two, another hidden size for one
    changed = {"compatible": {**SMALL, "rope_theta": 1000000}, "paused": {**SMALL, "rope_theta": 1000000},
               "incompatible": {**SMALL, "hidden_size": 512}, "retrain": {**SMALL, "rope_theta": 1000000}}  # fmt: skip
    for name, config in changed.items():
        s3.put_object(Bucket=bucket, Key=f"v-{namespace}-{name}/config.json", Body=json.dumps(config).encode())

    # Redeploy + compatible: re-audited, a new revision rolled out with verifier and draft together
    def moved() -> None:
        now = get(cluster, namespace, "sdep/compatible")["status"]["verifierRevision"]
        assert now != before["compatible"]["verifierRevision"], "the verifier revision has not moved yet"

    eventually(moved, timeout=120)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/compatible", "--timeout=120s")
    st = get(cluster, namespace, "sdep/compatible")["status"]
    assert st["revision"] != before["compatible"]["revision"]
    dep = get(cluster, namespace, "deployment/compatible")
    assert dep["spec"]["template"]["metadata"]["annotations"]["speculators.dev/revision"] == st["revision"]
    stage = dep["spec"]["template"]["spec"]["initContainers"]
    assert any(st["verifierRevision"] in c["args"] for c in stage)  # new pods stage exactly the audited verifier

    # Redeploy + incompatible: the audit fails, the last good pair keeps serving
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Degraded", "sdep/incompatible",
                    "--timeout=120s")  # fmt: skip
    st = get(cluster, namespace, "sdep/incompatible")["status"]
    assert any(f["rule"] == "verifier-hidden-size" for f in st["audit"]["findings"])
    # the last good pair serves, the new verifier is refused for good: Stalled (kstatus Failed, Argo CD Degraded)
    degraded = get(cluster, namespace, "sdep/incompatible")
    assert {c["type"]: c for c in st["conditions"]}["Stalled"]["reason"] == "AuditFailed"
    assert gitops(bin_dir, "kstatus", objects=[degraded])[0]["status"] == "Failed"
    assert gitops(bin_dir, "health", str(ARGOCD_DEPLOYMENT), objects=[degraded])[0]["status"] == "Degraded"
    dep = get(cluster, namespace, "deployment/incompatible")
    assert dep["metadata"]["annotations"]["speculators.dev/revision"] == before["incompatible"]["revision"]

    # Pause: VerifierCurrent=False and nothing moves
    cluster.kubectl("wait", "-n", namespace, "--for=condition=VerifierCurrent=False", "sdep/paused",
                    "--timeout=120s")  # fmt: skip
    st = get(cluster, namespace, "sdep/paused")["status"]
    assert st["revision"] == before["paused"]["revision"]
    assert st["phase"] == "Ready"
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["VerifierCurrent"]["reason"] == "VerifierChanged"

    # Retrain: a SpeculatorTrainJob from the template trains for the new verifier while the old pair serves;
    # its result is handed back, audited against the new verifier, and rolled out with it
    def retraining() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/retrain")["status"]
        assert st.get("retrain"), "no retraining yet"
        return st  # type: ignore[no-any-return]

    st = eventually(retraining, timeout=120)
    job = st["retrain"]["job"]
    assert st["retrain"]["verifierRevision"] != before["retrain"]["verifierRevision"]
    assert {c["type"]: c for c in st["conditions"]}["VerifierCurrent"]["reason"] == "Retraining"
    assert st["revision"] == before["retrain"]["revision"]  # still the old pair
    stj = get(cluster, namespace, f"stj/{job}")
    assert stj["spec"]["deployTo"] == "retrain"
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", f"stj/{job}",
                    "--timeout=180s")  # fmt: skip

    def adopted() -> None:
        st = get(cluster, namespace, "sdep/retrain")["status"]
        assert st.get("draftSource") == f"s3://{bucket}/{retrained}", st.get("draftSource")
        assert "retrain" not in st
        assert st["phase"] == "Ready"

    eventually(adopted, timeout=120)
    st = get(cluster, namespace, "sdep/retrain")["status"]
    assert st["revision"] != before["retrain"]["revision"]
    assert st["verifierRevision"] != before["retrain"]["verifierRevision"]
    assert {c["type"]: c for c in st["conditions"]}["VerifierCurrent"]["status"] == "True"
    assert st["handedOver"]["trainJob"] == job

    # what a self-healing GitOps tool does: the user's manifest from git applied again, here with an edit elsewhere
    # (replicas) so that a whole pass runs; no spec was written by the operator, so nothing is reverted
    obj = get(cluster, namespace, "sdep/retrain")
    assert obj["spec"]["speculator"]["source"] == manifests["retrain"]["spec"]["speculator"]["source"] == store["good"]
    again = json.loads(json.dumps(manifests["retrain"]))
    again["spec"]["serving"]["replicas"] = 1
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(again))

    def reapplied() -> dict[str, Any]:
        obj = get(cluster, namespace, "sdep/retrain")
        assert (
            obj["status"]["observedGeneration"]
            == obj["metadata"]["generation"]
            > before["retrain"]["observedGeneration"]
        )
        assert obj["status"]["readyReplicas"] == 1
        return obj  # type: ignore[no-any-return]

    obj = eventually(reapplied, timeout=120)
    assert obj["status"]["draftSource"] == f"s3://{bucket}/{retrained}"
    assert obj["status"]["verifierRevision"] == st["verifierRevision"]


def test_a_refused_child_is_reported_and_retried(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="no-services"),
                                   spec=client.V1ResourceQuotaSpec(hard={"services": "0"}))  # fmt: skip
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_resource_quota(namespace, quota)
    # the quota controller must have counted usage before the API server enforces it
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.hard.services}=0", "resourcequota/no-services",
                    "--timeout=60s")  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("quota", store, "good", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Serving=False", "sdep/quota", "--timeout=120s")
    conds = {c["type"]: c for c in get(cluster, namespace, "sdep/quota")["status"]["conditions"]}
    assert conds["Serving"]["reason"] == "ApplyFailed"
    assert "exceeded quota" in conds["Serving"]["message"]
    eventually(lambda: _events(cluster, namespace, "quota", "ApplyFailed"))
    core.delete_namespaced_resource_quota("no-services", namespace)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/quota", "--timeout=120s")


def test_a_missing_credentials_secret_waits_with_a_reason(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("nocreds", store, "good", "no-such-secret"))
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Pending", "sdep/nocreds",
                    "--timeout=120s")  # fmt: skip
    conds = {c["type"]: c for c in get(cluster, namespace, "sdep/nocreds")["status"]["conditions"]}
    assert conds["Audited"]["reason"] == "CredentialsUnreadable"
    assert "no-such-secret" in conds["Audited"]["message"]
