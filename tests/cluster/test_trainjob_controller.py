"""The SpeculatorTrainJob operator, in-process, against the real control plane: kwok completes the stage
pods (and fails the ones labelled to fail); reports the real entrypoint would write are given to kwok as
termination messages."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner
from kubernetes import client

from .conftest import Cluster, eventually, get, sdep, stj

pytestmark = pytest.mark.cluster

REPORT = {"speculatorsReport": 1, "samples": 4, "fingerprint": "fp-test", "digest": "sha256:feed", "epoch": 3}


def simulated(**labels: str) -> dict[str, Any]:
    return {
        "annotations": {"speculators.dev/simulate-message": json.dumps(REPORT)},
        **({"labels": labels} if labels else {}),
    }


OFFLINE_STAGES = ["fetch", "prepare", "extract", "train", "audit", "publish"]


def slow_offline(name: str, store: dict[str, str], creds: str, delay: str) -> str:
    """An offline run (pretokenized data) whose stage pods each take `delay`: time for a fault between stages."""
    slow = {"annotations": {"speculators.dev/simulate-message": json.dumps(REPORT),
                            "speculators.dev/simulate-delay": delay}}  # fmt: skip
    return stj(name, store, creds, data={"sources": [store["data"]], "format": "pretokenized"},
               stages={"cpu": slow, "trainer": slow})  # fmt: skip


def stage_job_writes(writes: list[str], name: str) -> None:
    """Each stage's Job written exactly once (the operator's writes from the API server's audit log)."""
    job_writes = sorted(w for w in writes if w.split()[1].startswith("jobs/"))
    assert job_writes == sorted(f"patch jobs//{name}-{s}" for s in OFFLINE_STAGES), job_writes


def api_calls(cluster: Cluster, namespace: str) -> list[tuple[str, str, str, str]]:
    """(time, verb, resource, name) of every request in `namespace`, from the API server's audit log."""
    assert cluster.local is not None
    assert cluster.local.audit_log is not None
    out = []
    for line in Path(cluster.local.audit_log).read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if event.get("stage") == "ResponseComplete" and ref.get("namespace") == namespace and ref.get("name"):
            out.append((event["requestReceivedTimestamp"], event["verb"], ref.get("resource", ""), ref["name"]))
    return sorted(out)


def listed(cluster: Cluster, namespace: str, kinds: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "-n", namespace, kinds, "-l", selector, "-o", "json").stdout
    return json.loads(out)["items"]  # type: ignore[no-any-return]


def jobs(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    items = listed(cluster, namespace, "jobs", f"speculators.dev/trainjob={name}")
    return {j["metadata"]["labels"]["speculators.dev/stage"]: j for j in items}


def wait_phase(cluster: Cluster, namespace: str, name: str, phase: str, timeout: int = 180) -> dict[str, Any]:
    cluster.kubectl("wait", "-n", namespace, f"--for=jsonpath={{.status.phase}}={phase}", f"stj/{name}",
                    f"--timeout={timeout}s")  # fmt: skip
    return get(cluster, namespace, f"stj/{name}")


def test_offline_run_passes_every_stage_in_order(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    workspace("offline-workspace")
    manifest = stj(
        "offline", store, creds,
        data={"sources": [store["data"]], "format": "pretokenized", "regenerate": {"dataset": "ultrachat", "limit": 4},
              "maxSamples": 4},
        draft={"draftVocabSize": 1024},
        stages={"cpu": simulated(), "trainer": simulated()},
    )  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "stj/offline", "--timeout=180s")
    obj = get(cluster, namespace, "stj/offline")
    st = obj["status"]
    assert st["phase"] == "Succeeded"
    order = ["fetch", "regenerate", "prepare", "extract", "train", "audit", "publish"]
    assert [s["name"] for s in st["stages"]] == order
    assert all(s["phase"] == "Succeeded" for s in st["stages"])
    assert st["checkpoint"] == {"uri": store["good"], "digest": "sha256:feed"}
    assert st["progress"] == {"samplesTotal": 4, "samplesExtracted": 4, "epoch": 3, "epochs": 3}
    prov = st["provenance"]
    assert prov["speculators"] == "0.9.0"
    assert prov["vllm"] == "0.32.0"
    assert prov["verifierRevision"].startswith("s3:")
    assert prov["verifierLayers"] == 8
    assert prov["dataFingerprint"] == "fp-test"
    assert "--no-skip-token-freq" in prov["commands"]["prepare"]
    assert "--on-missing raise" in prov["commands"]["train"]
    assert "--fail-on-error" in prov["commands"]["extract"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Audited"]["status"] == "True"
    assert conds["Published"]["status"] == "True"
    assert conds["Ready"]["observedGeneration"] == obj["metadata"]["generation"]

    # one Job per stage, each started only after the previous one completed
    found = jobs(cluster, namespace, "offline")
    assert sorted(found) == sorted(order)
    for before, after in itertools.pairwise(order):
        assert found[after]["status"]["startTime"] >= found[before]["status"]["completionTime"], (before, after)
        assert found[after]["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    train = found["train"]["spec"]["template"]["spec"]
    assert train["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert train["terminationGracePeriodSeconds"] > 120
    assert train["containers"][0]["args"][5:8] == ["torchrun", "--standalone", "--nproc-per-node"]

    # each vLLM server existed only while a stage needed it, and was ready before its client started
    calls = api_calls(cluster, namespace)
    first = {}
    for t, verb, resource, name in calls:
        first.setdefault((verb, resource, name), t)
    assert first[("patch", "deployments", "offline-verifier")] < first[("patch", "jobs", "offline-regenerate")]
    assert first[("patch", "deployments", "offline-extractor")] < first[("patch", "jobs", "offline-extract")]
    assert first[("delete", "deployments", "offline-verifier")] < first[("patch", "jobs", "offline-train")]
    assert first[("delete", "deployments", "offline-extractor")] < first[("patch", "jobs", "offline-audit")]
    assert listed(cluster, namespace, "deployments", "speculators.dev/trainjob=offline") == []

    table = cluster.kubectl("get", "speculators", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "VERIFIER", "ALGORITHM", "STAGE", "EPOCH", "STEP", "CHECKPOINT", "AGE"]
    assert table[1].split()[:4] == ["speculatortrainjob.speculators.dev/offline", "Succeeded", store["verifier"],
                                    "eagle3"]  # fmt: skip

    # deletion takes every child with it (the controller-manager's garbage collector)
    cluster.kubectl("delete", "-n", namespace, "stj/offline", "--wait=true", "--timeout=60s")

    def gone() -> None:
        assert listed(cluster, namespace, "jobs,pvc", "speculators.dev/trainjob=offline") == []

    eventually(gone, timeout=60)


def test_online_training_on_two_nodes(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    workspace("online-workspace")
    manifest = stj(
        "online", store, creds, algorithm="dflash",
        data={"sources": [store["data"]], "format": "pretokenized"},
        draft={"blockSize": 8},
        hiddenStates={"mode": "online"},
        training={"nodes": 2, "gpusPerNode": 4},
        stages={"cpu": simulated(), "trainer": {"annotations": {"speculators.dev/simulate-delay": "3s"}}},
    )  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def training() -> dict[str, Any]:
        st = get(cluster, namespace, "stj/online").get("status", {})
        assert st.get("phase") == "Training", st.get("phase")
        assert listed(cluster, namespace, "jobs", "speculators.dev/stage=train")
        return st

    eventually(training, timeout=120, interval=0.2)
    # the extraction server serves the trainer while it trains
    extractor = get(cluster, namespace, "deployment/online-extractor")
    (c,) = extractor["spec"]["template"]["spec"]["containers"]
    spec_config = json.loads(c["args"][c["args"].index("--speculative-config") + 1])
    assert spec_config["method"] == "extract_hidden_states"
    assert spec_config["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5, 8]
    assert c["args"][c["args"].index("--served-model-name") + 1] == "/workspace/verifier"

    job = get(cluster, namespace, "job/online-train")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == 2
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--nnodes") + 1] == "2"
    assert args[args.index("--node-rank") + 1] == "$(JOB_COMPLETION_INDEX)"
    assert args[args.index("--vllm-endpoint") + 1] == f"http://online-extractor.{namespace}.svc:8000/v1"
    assert args[args.index("--target-layer-ids") + 1 : args.index("--target-layer-ids") + 4] == ["2", "4", "5"]
    assert job["spec"]["template"]["spec"]["subdomain"] == "online-train"
    headless = get(cluster, namespace, "service/online-train")
    assert headless["spec"]["clusterIP"] == "None"

    st = wait_phase(cluster, namespace, "online", "Succeeded")
    assert [s["name"] for s in st["status"]["stages"]] == ["fetch", "prepare", "train", "audit", "publish"]
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(namespace, label_selector="speculators.dev/stage=train")
    assert len(pods.items) == 2
    assert all(p.spec.node_name.startswith("kwok-gpu") for p in pods.items)
    # the rank in the rendered args is expanded from the index the Job controller gives each pod
    for pod in pods.items:
        env = {e.name for e in pod.spec.containers[0].env or []}
        assert "JOB_COMPLETION_INDEX" in env
    assert listed(cluster, namespace, "deployments", "speculators.dev/trainjob=online") == []


def test_a_failing_stage_retries_then_fails_and_publishes_nothing(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    workspace("broken-workspace")
    manifest = stj(
        "broken", store, creds, retries=1,
        data={"sources": [store["data"]], "format": "pretokenized"},
        stages={"cpu": simulated(), "trainer": simulated(**{"speculators.dev/simulate": "fail"})},
    )  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    st = wait_phase(cluster, namespace, "broken", "Failed")["status"]
    assert st["stage"] == "train"
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Failed"]["status"] == "True"
    assert conds["Failed"]["reason"] == "StageFailed"
    assert "BackoffLimitExceeded" in conds["Failed"]["message"]
    assert "simulated failure" in conds["Failed"]["message"]  # the pod's own last words
    train = next(s for s in st["stages"] if s["name"] == "train")
    assert train["phase"] == "Failed"
    assert train["failures"] == 2
    found = jobs(cluster, namespace, "broken")
    assert "audit" not in found
    assert "publish" not in found
    assert "checkpoint" not in st
    out = cluster.kubectl(
        "get", "-n", namespace, "events", "--field-selector", "involvedObject.name=broken", "-o", "json"
    )
    events = json.loads(out.stdout)["items"]
    assert any(e["reason"] == "StageFailed" and e["type"] == "Warning" for e in events)

    # fix the cause (the stage's pod options may change), delete the failed Job: the run goes on from there
    cluster.kubectl("patch", "-n", namespace, "stj/broken", "--type=merge",
                    "-p", json.dumps({"spec": {"stages": {"trainer": {"labels": None}}}}))  # fmt: skip
    cluster.kubectl("delete", "-n", namespace, "job/broken-train", "--wait=true")
    st = wait_phase(cluster, namespace, "broken", "Succeeded")["status"]
    assert [s["phase"] for s in st["stages"]] == ["Succeeded"] * 6
    assert "completionTime" in st
    out = cluster.kubectl(
        "get", "-n", namespace, "events", "--field-selector", "involvedObject.name=broken", "-o", "json"
    )
    assert any(e["reason"] == "Resumed" for e in json.loads(out.stdout)["items"])


def test_operator_refuses_unknown_train_flags_before_any_pod(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    manifest = stj("flags", store, creds, training={"extraArgs": ["--learning-rate", "1e-4"]})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    st = wait_phase(cluster, namespace, "flags", "Failed")["status"]
    message = {c["type"]: c for c in st["conditions"]}["Failed"]["message"]
    assert "--learning-rate is not a flag of speculators 0.9.0 train" in message
    assert listed(cluster, namespace, "jobs,pvc", "speculators.dev/trainjob=flags") == []


def test_a_finished_job_is_served_by_the_deployments_that_want_it(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    workspace("handoff-workspace")
    # one deployment follows the job by name; another serves a broken draft until the job patches it
    follow = json.loads(sdep("follow", store, "good", creds))
    follow["spec"]["speculator"] = {"fromTrainJob": "handoff"}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(follow))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("patched", store, "bad", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Pending", "sdep/follow", "--timeout=60s")
    waiting = {c["type"]: c for c in get(cluster, namespace, "sdep/follow")["status"]["conditions"]}
    assert waiting["Audited"]["reason"] == "TrainJobPending"
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "sdep/patched", "--timeout=60s")

    data = {"sources": [store["data"]], "format": "pretokenized"}
    manifest = stj("handoff", store, creds, deployTo="patched", data=data, stages={"cpu": simulated()})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "stj/handoff", "--timeout=180s")
    # the follower audits and serves the published checkpoint
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/follow", "--timeout=120s")
    st = get(cluster, namespace, "sdep/follow")["status"]
    assert st["draftSource"] == store["good"]
    assert st["audit"]["ok"] is True
    # the deployTo target took it into its status, re-audited and rolled it out; its spec is the user's, untouched
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/patched", "--timeout=120s")
    patched = get(cluster, namespace, "sdep/patched")
    assert patched["spec"]["speculator"]["source"] == store["bad"]
    assert patched["metadata"]["generation"] == 1
    assert patched["status"]["handedOver"]["trainJob"] == "handoff"
    assert patched["status"]["handedOver"]["uri"] == patched["status"]["draftSource"] == store["good"]
    job = get(cluster, namespace, "stj/handoff")["status"]
    assert job["deployedTo"] == "patched"
    assert {c["type"]: c for c in job["conditions"]}["HandedOff"]["reason"] == "Offered"
