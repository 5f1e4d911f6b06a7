"""A revision names the bytes: on the real control plane with the real S3 server, drafts replaced in place,
drafts trained for another verifier revision, a Retrain hand-off with replicas of the old revision
restarting, and the retention of published checkpoints.

kwok plays the pods, so what a pod's init container would do is done here by running the real
`speculator-operator stage` with the exact arguments of the rendered pod template (each ReplicaSet
keeps its own) against the S3 server; what a train job's publish stage would write is written by the
real `trainer publish` code."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.adapters.checkpoints import read_verifier
from speculator_operator.api import podcontract
from speculator_operator.pods import trainer

from ..ckptgen import eagle3, write_checkpoint
from .conftest import SMALL, Cluster, eventually, existing_claim, get, sdep, stj

pytestmark = pytest.mark.cluster


def bucket_of(uri: str) -> str:
    return uri.removeprefix("s3://").split("/")[0]


def draft(folder: Path, fill: bytes) -> Path:
    """An EAGLE-3 draft for the small verifier; `fill` makes its weights differ under the same config.json."""
    return write_checkpoint(folder, *eagle3(SMALL, draft_vocab=1024), sparse=False, fill=fill)


def upload(s3: Any, folder: Path, uri: str) -> None:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    for path in sorted(folder.iterdir()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def publish(tmp: Path, folder: Path, output: str, verifier: str, revision: str) -> dict[str, Any]:
    """What a train job's publish stage does (the real code): returns its report (exact location, digest)."""
    run = tmp / f"run-{hashlib.sha256(str(folder).encode()).hexdigest()[:8]}"
    run.mkdir()
    (run / "0").symlink_to(folder)  # the layout `speculators train` leaves: epoch folders
    report = tmp / f"report-{run.name}"
    os.environ[podcontract.REPORT_PATH_ENV] = str(report)
    try:
        assert trainer.publish(str(run), output, verifier, revision, "test/job", "2026.11-vllm0.32") == 0
    finally:
        del os.environ[podcontract.REPORT_PATH_ENV]
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def kwok_run(
    store: dict[str, str], output: str, creds: str, claim: str, report: dict[str, Any], **output_options: Any
) -> dict[str, Any]:
    """A train job spec (without the verifier) whose pods kwok plays: pretokenized data, a workspace claim
    made in advance, and a publish stage that reports `report` (what the real publish code wrote)."""
    message = json.dumps({"speculatorsReport": 1, "stage": "publish", **report})
    return {
        "algorithm": "eagle3",
        "data": {"sources": [store["data"]], "format": "pretokenized"},
        "output": {"uri": output, "credentials": {"name": creds}, **output_options},
        "workspace": {"claimName": claim},
        "retries": 0,
        "stages": {"cpu": {"annotations": {"speculators.dev/simulate-message": message}}},
    }


def template(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, namespace, f"deployment/{name}")["spec"]["template"]  # type: ignore[no-any-return]


def stage(pod_template: dict[str, Any], which: str, dest: Path) -> subprocess.CompletedProcess[str]:
    """Run the stage init container of a rendered pod template, as the kubelet would, here."""
    (container,) = [c for c in pod_template["spec"]["initContainers"] if c["name"] == f"stage-{which}"]
    args = [*container["args"][:2], str(dest), *container["args"][3:]]  # the pod's /models/... is a folder here
    return subprocess.run(
        [sys.executable, "-m", "speculator_operator.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )


def staged_weights(pod_template: dict[str, Any], dest: Path) -> str:
    """The sha256 of the weights the draft's stage container of this pod template stages (it must succeed)."""
    done = stage(pod_template, "draft", dest)
    assert done.returncode == 0, done.stderr
    return sha(dest / "model.safetensors")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = [
        e
        for e in get(cluster, namespace, "events")["items"]
        if e["involvedObject"].get("name") == name and e["reason"] == reason
    ]
    assert found, f"no {reason} event for {name}"
    return found


def test_a_draft_replaced_in_place_gets_a_new_revision_and_follows_on_draft_change(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
) -> None:
    bucket = bucket_of(store["verifier"])
    old, new = draft(tmp_path / "old", b"\x01"), draft(tmp_path / "new", b"\x02")
    assert (old / "config.json").read_bytes() == (new / "config.json").read_bytes()
    for name, policy in (("redeploy", "Redeploy"), ("paused", "Pause")):
        upload(s3, old, f"s3://{bucket}/inplace-{namespace}-{name}")
        doc = json.loads(sdep(name, {**store, name: f"s3://{bucket}/inplace-{namespace}-{name}"}, name, creds))
        doc["spec"]["upgradePolicy"] = {"onDraftChange": policy, "pollIntervalSeconds": 30}
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    before = {}
    for name in ("redeploy", "paused"):
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"sdep/{name}", "--timeout=120s")
        before[name] = (get(cluster, namespace, f"sdep/{name}")["status"], template(cluster, namespace, name))
    assert before["redeploy"][0]["draftRevision"].startswith("s3:")
    # a replica of the audited revision stages exactly the audited bytes
    assert staged_weights(before["paused"][1], tmp_path / "staged-before") == sha(old / "model.safetensors")

    # new weights under the same config.json, in place
    for name in ("redeploy", "paused"):
        s3.upload_file(str(new / "model.safetensors"), bucket, f"inplace-{namespace}-{name}/model.safetensors")

    # Redeploy: the next poll sees a new revision, audits it and rolls the pair out
    def moved() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/redeploy")["status"]
        assert st["draftRevision"] != before["redeploy"][0]["draftRevision"], "the draft revision has not moved"
        return st  # type: ignore[no-any-return]

    eventually(moved, timeout=150)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/redeploy", "--timeout=120s")
    st = get(cluster, namespace, "sdep/redeploy")["status"]
    assert st["revision"] != before["redeploy"][0]["revision"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["DraftCurrent"] == "True"
    assert "auditing it to roll it out" in events(cluster, namespace, "redeploy", "DraftChanged")[0]["message"]
    rolled = template(cluster, namespace, "redeploy")
    assert rolled["metadata"]["annotations"]["speculators.dev/revision"] == st["revision"]
    assert staged_weights(rolled, tmp_path / "staged-new") == sha(new / "model.safetensors")

    # Pause: DraftCurrent=False, a Warning, nothing moves ...
    cluster.kubectl("wait", "-n", namespace, "--for=condition=DraftCurrent=False", "sdep/paused", "--timeout=150s")
    st = get(cluster, namespace, "sdep/paused")["status"]
    assert st["revision"] == before["paused"][0]["revision"]
    assert st["draftRevision"] == before["paused"][0]["draftRevision"]
    assert {c["type"]: c["reason"] for c in st["conditions"]}["DraftCurrent"] == "DraftChanged"
    assert events(cluster, namespace, "paused", "DraftChanged")[0]["type"] == "Warning"
    assert template(cluster, namespace, "paused") == before["paused"][1]
    # ... and a replica of the old revision that restarts refuses the new bytes, naming the file
    refused = stage(before["paused"][1], "draft", tmp_path / "staged-after")
    assert refused.returncode == 1
    assert "model.safetensors is not the audited file: replaced after the audit" in refused.stderr
    assert not (tmp_path / "staged-after" / "model.safetensors").exists()


def test_a_draft_trained_for_another_verifier_revision_is_refused_before_any_pod(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
) -> None:
    served = read_verifier(store["verifier"]).revision
    assert served is not None
    output = f"s3://{bucket_of(store['verifier'])}/published-{namespace}"
    report = publish(tmp_path, draft(tmp_path / "d", b"\x03"), output, store["verifier"], "s3:" + "0" * 24)
    # the deployment names output.uri: its pointer leads to the exact location, which is what is audited
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("stale", {**store, "out": output}, "out", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "sdep/stale", "--timeout=120s")
    st = get(cluster, namespace, "sdep/stale")["status"]
    assert st["draftSource"] == report["uri"]
    (finding,) = [f for f in st["audit"]["findings"] if f["rule"] == "verifier-revision"]
    assert finding["severity"] == "error"
    assert "s3:" + "0" * 24 in finding["message"]
    assert served in finding["message"]
    assert cluster.kubectl("get", "-n", namespace, "deployment/stale", check=False).returncode != 0
    assert "verifier-revision" in events(cluster, namespace, "stale", "AuditFailed")[0]["message"]


def test_a_retrain_hand_off_keeps_old_replicas_on_the_old_draft(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
    workspace: Any,
) -> None:
    bucket = bucket_of(store["verifier"])
    verifier = f"s3://{bucket}/v-{namespace}"
    output = f"s3://{bucket}/drafts-{namespace}"
    s3.put_object(Bucket=bucket, Key=f"v-{namespace}/config.json", Body=json.dumps(SMALL).encode())
    moved_verifier = json.dumps({**SMALL, "rope_theta": 1000000}).encode()
    # a revision names bytes, not a place: the new verifier's revision, learnt from a copy elsewhere
    s3.put_object(Bucket=bucket, Key=f"scratch-{namespace}/config.json", Body=moved_verifier)
    old_rev, new_rev = read_verifier(verifier).revision, read_verifier(f"s3://{bucket}/scratch-{namespace}").revision
    assert old_rev is not None
    assert new_rev is not None
    assert old_rev != new_rev
    old, new = draft(tmp_path / "old", b"\x04"), draft(tmp_path / "new", b"\x05")
    # what the retraining will publish (kwok runs no trainer), then the draft that serves now (the pointer)
    retrained = publish(tmp_path, new, output, verifier, new_rev)
    first = publish(tmp_path, old, output, verifier, old_rev)
    train = kwok_run(store, output, creds, existing_claim(cluster, namespace, workspace, "retrain-ws"), retrained)
    doc = json.loads(sdep("retrain", {**store, "verifier": verifier, "out": output}, "out", creds))
    doc["spec"]["upgradePolicy"] = {"onVerifierChange": "Retrain", "pollIntervalSeconds": 30, "trainTemplate": train}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/retrain", "--timeout=120s")
    st = get(cluster, namespace, "sdep/retrain")["status"]
    assert st["draftSource"] == first["uri"]  # the exact location the pointer named
    assert st["verifierRevision"] == old_rev
    old_template = template(cluster, namespace, "retrain")

    s3.put_object(Bucket=bucket, Key=f"v-{namespace}/config.json", Body=moved_verifier)  # the verifier moves

    def retraining() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/retrain")["status"]
        assert st.get("retrain"), "no retraining yet"
        return st  # type: ignore[no-any-return]

    job = eventually(retraining, timeout=150)["retrain"]["job"]
    # a replica of the old revision that restarts meanwhile gets the old draft, from its own location ...
    assert staged_weights(old_template, tmp_path / "old-replica") == sha(old / "model.safetensors")
    # ... and refuses the verifier that moved in place: never the new verifier with the old draft
    moved = stage(old_template, "verifier", tmp_path / "old-replica-verifier")
    assert moved.returncode == 1
    assert "config.json is not the audited file" in moved.stderr

    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", f"stj/{job}", "--timeout=180s")
    assert get(cluster, namespace, f"stj/{job}")["status"]["checkpoint"]["uri"] == retrained["uri"]

    def handed_over() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/retrain")["status"]
        assert st.get("draftSource") == retrained["uri"], st.get("draftSource")
        assert st["phase"] == "Ready"
        return st  # type: ignore[no-any-return]

    st = eventually(handed_over, timeout=120)
    assert st["verifierRevision"] == new_rev
    assert st["handedOver"]["uri"] == retrained["uri"]  # held in status: the spec is the user's, untouched
    assert get(cluster, namespace, "sdep/retrain")["spec"]["speculator"]["source"] != retrained["uri"]
    new_template = template(cluster, namespace, "retrain")
    assert staged_weights(new_template, tmp_path / "new-replica") == sha(new / "model.safetensors")
    assert stage(new_template, "verifier", tmp_path / "new-replica-verifier").returncode == 0
    # the old revision's replicas still find their draft where it was published: nothing was overwritten
    assert staged_weights(old_template, tmp_path / "old-replica-late") == sha(old / "model.safetensors")


def test_retention_deletes_only_what_nothing_names(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
    workspace: Any,
) -> None:
    bucket = bucket_of(store["verifier"])
    output = f"s3://{bucket}/kept-{namespace}"
    revision = read_verifier(store["verifier"]).revision
    assert revision is not None
    named, unnamed, newest = (
        publish(tmp_path, draft(tmp_path / f"d{i}", bytes([16 + i])), output, store["verifier"], revision)
        for i in range(3)
    )
    # an old ReplicaSet (scaled to zero, kept for roll-backs) whose pods stage the first location, as its pod
    # template's annotation says
    labels = {"app.kubernetes.io/managed-by": "speculator-operator", "speculators.dev/deployment": "old"}
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "old-1", "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"speculators.dev/draft-location": named["uri"]}},
                "spec": {
                    "initContainers": [
                        {"name": "stage-draft", "image": "x", "args": ["stage", named["uri"], "/models/draft"]}
                    ],
                    "containers": [{"name": "vllm", "image": "x"}],
                },
            },
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(rs))
    claim = existing_claim(cluster, namespace, workspace, "ws")
    job = stj("keep", store, creds, **kwok_run(store, output, creds, claim, newest, keepLatest=1))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=job)

    def applied() -> dict[str, Any]:
        st = get(cluster, namespace, "stj/keep").get("status") or {}  # none yet right after the apply
        assert "retention" in st, "keepLatest not applied yet"
        return st  # type: ignore[no-any-return]

    st = eventually(applied, timeout=180)
    assert st["retention"] == {"keepLatest": 1, "deleted": [unnamed["uri"]], "kept": [named["uri"]]}
    assert "deleted 1 published folder" in events(cluster, namespace, "keep", "Pruned")[0]["message"]

    def objects(uri: str) -> list[str]:
        prefix = uri.removeprefix(f"s3://{bucket}/") + "/"
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]

    assert objects(unnamed["uri"]) == []
    for kept in (named, newest):
        assert len(objects(kept["uri"])) == 3, objects(kept["uri"])  # config, weights, provenance record
