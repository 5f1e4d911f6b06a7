"""The generated CRDs on the real API server: structural, explained, validated field by field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .conftest import Cluster, eventually

pytestmark = pytest.mark.cluster


def sdep(name: str, spec: dict[str, object]) -> str:
    return json.dumps({"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment",
                       "metadata": {"name": name}, "spec": spec})  # fmt: skip


GOOD = {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/qwen3-8b-eagle3"}}


def test_crds_are_established_and_explained(cluster: Cluster, operator_crds: list[str]) -> None:
    assert "speculatordeployments.speculators.dev" in operator_crds
    for name in operator_crds:
        crd = json.loads(cluster.kubectl("get", "crd", name, "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True"
        assert conditions.get("NonStructuralSchema") is None
    # kubectl explain reads the published OpenAPI, which follows the CRD by a moment
    out = eventually(lambda: cluster.kubectl("explain", "sdep.spec.serving.cutoff").stdout)
    assert "maxBatchSize" in out
    assert "Switch speculation off above a batch size" in out


def test_valid_object_is_defaulted(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("ok", GOOD))
    obj = json.loads(cluster.kubectl("get", "-n", namespace, "sdep/ok", "-o", "json").stdout)
    serving = obj["spec"]["serving"]
    assert serving["replicas"] == 1
    assert serving["numSpeculativeTokens"] == "auto"
    assert obj["spec"]["verifier"]["revision"] == "main"
    assert obj["spec"]["upgradePolicy"]["onVerifierChange"] == "Redeploy"
    assert "canary" not in obj["spec"]["upgradePolicy"]  # off unless set
    assert "learning" not in obj["spec"]  # off unless set: captured traffic is user data
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=sdep("canary", {**GOOD, "upgradePolicy": {"canary": {}}})
    )
    obj = json.loads(cluster.kubectl("get", "-n", namespace, "sdep/canary", "-o", "json").stdout)
    assert obj["spec"]["upgradePolicy"]["canary"] == {
        "replicas": 1, "mode": "Surge", "intervalSeconds": 300, "minDrafts": 200, "metric": "Alpha", "margin": 0.05,
        "promoteAfter": 3, "rollbackAfter": 2, "maxFailures": 3,
    }  # fmt: skip


BAD = {
    "both sources": ({**GOOD, "speculator": {"source": "hf://a/b", "fromTrainJob": "j"}},
                     "spec.speculator: Invalid value", "set exactly one of speculator.source or"),
    "no source": ({**GOOD, "speculator": {}}, "spec.speculator: Invalid value", "set exactly one"),
    "K too large": ({**GOOD, "serving": {"numSpeculativeTokens": 65}}, "spec.serving.numSpeculativeTokens",
                    "an integer in 1..64 or 'auto'"),
    "K word": ({**GOOD, "serving": {"numSpeculativeTokens": "many"}}, "spec.serving.numSpeculativeTokens",
               "an integer in 1..64 or 'auto'"),
    "cutoff zero": ({**GOOD, "serving": {"cutoff": {"maxBatchSize": 0}}}, "spec.serving.cutoff.maxBatchSize",
                    "should be greater than or equal to 1"),
    "negative replicas": ({**GOOD, "serving": {"replicas": -1}}, "spec.serving.replicas",
                          "should be greater than or equal to 0"),
    "owned flag": ({**GOOD, "serving": {"extraArgs": ["--enforce-eager", "--speculative-config={}"]}},
                   "spec.serving.extraArgs", "may not set flags the operator renders"),
    "removed knob": ({**GOOD, "serving": {"extraArgs": ['--x={"disable_by_batch_size": 4}']}},
                     "spec.serving.extraArgs", "disable_by_batch_size"),
    "bad policy": ({**GOOD, "upgradePolicy": {"onVerifierChange": "Yolo"}}, "spec.upgradePolicy.onVerifierChange",
                   'Unsupported value: "Yolo"'),
    "no verifier": ({"speculator": {"source": "hf://a/b"}}, "spec.verifier", "Required value"),
    "canary fraction": ({**GOOD, "upgradePolicy": {"canary": {"replicas": "150%"}}},
                        "spec.upgradePolicy.canary.replicas", "an integer in 1..1024 or a percentage"),
    "canary none": ({**GOOD, "upgradePolicy": {"canary": {"replicas": 0}}}, "spec.upgradePolicy.canary.replicas",
                    "an integer in 1..1024 or a percentage"),
    "canary in place on one replica": ({**GOOD, "serving": {"replicas": 1}, "upgradePolicy": {"canary": {
        "mode": "InPlace"}}}, "spec.upgradePolicy.canary.mode: Invalid value",
        "an InPlace canary needs serving.replicas above canary.replicas"),
    "canary interval": ({**GOOD, "upgradePolicy": {"canary": {"intervalSeconds": 5}}},
                        "spec.upgradePolicy.canary.intervalSeconds", "should be greater than or equal to 10"),
    "canary margin": ({**GOOD, "upgradePolicy": {"canary": {"margin": -0.1}}}, "spec.upgradePolicy.canary.margin",
                      "should be greater than or equal to 0"),
    "adaptive with a cutoff": ({**GOOD, "serving": {"adaptiveVerification": True, "cutoff": {"maxBatchSize": 8}}},
                               "spec.serving: Invalid value", "cannot both decide K"),
    "adaptive canary on alpha": ({**GOOD, "serving": {"adaptiveVerification": True},
                                  "upgradePolicy": {"canary": {"replicas": 1}}},
                                 "spec.upgradePolicy.canary.metric", "a canary compares MeanAcceptedLength"),
    "declared algorithm": ({**GOOD, "speculator": {"source": "hf://a/b", "algorithm": "medusa"}},
                           "spec.speculator.algorithm", 'Unsupported value: "medusa"'),
}  # fmt: skip


def test_the_name_vllm_is_refused(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=sdep("vllm", GOOD))
    assert out.returncode != 0
    assert "may not be named vllm" in out.stderr


def test_sources_must_name_a_supported_scheme(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    bad = {**GOOD, "speculator": {"source": "ftp://host/draft"}}
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=sdep("bad", bad))
    assert out.returncode != 0
    assert "spec.speculator.source: Invalid value" in out.stderr


def stj(name: str, spec: dict[str, object]) -> str:
    return json.dumps({"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorTrainJob",
                       "metadata": {"name": name}, "spec": spec})  # fmt: skip


TRAIN = {"verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "dflash", "data": {"sources": ["hf:org/chats"]},
         "output": {"uri": "s3://drafts/qwen3-8b-dflash"}}  # fmt: skip


def test_train_jobs_are_defaulted_and_explained(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=stj("ok", TRAIN))
    spec = json.loads(cluster.kubectl("get", "-n", namespace, "stj/ok", "-o", "json").stdout)["spec"]
    assert spec["hiddenStates"]["mode"] == "offline"
    assert spec["hiddenStates"]["backend"] == "file"
    assert spec["workspace"]["accessMode"] == "ReadWriteMany"
    assert spec["training"]["nodes"] == 1
    assert spec["retries"] == 2
    out = eventually(lambda: cluster.kubectl("explain", "stj.spec.hiddenStates.mode").stdout)
    assert "--on-missing raise" in out


TRAIN_BAD = {
    "no data": ({**TRAIN, "data": {}}, "spec.data", "data needs sources or regenerate"),
    "preset as source": ({**TRAIN, "data": {"sources": ["sharegpt"]}}, "spec.data.sources[0]", "should match"),
    "block size": ({**TRAIN, "draft": {"blockSize": 1}}, "spec.draft.blockSize", "blockSize >= 2"),
    "offline mooncake": ({**TRAIN, "hiddenStates": {"backend": "mooncake", "mooncakeMaster": "m:1"}},
                         "spec.hiddenStates.backend", "generate-offline-data cannot use mooncake"),
    "online on RWO": ({**TRAIN, "hiddenStates": {"mode": "online"}, "workspace": {"accessMode": "ReadWriteOnce"}},
                      "spec.workspace.accessMode", "need a ReadWriteMany workspace"),
    "nodes on RWO": ({**TRAIN, "training": {"nodes": 2}, "workspace": {"accessMode": "ReadWriteOnce"}},
                     "spec.workspace.accessMode", "several nodes needs a ReadWriteMany workspace"),
    "mtp vocab": ({**TRAIN, "algorithm": "mtp", "draft": {"draftVocabSize": 32000}}, "spec.draft",
                  "draftVocabSize, numLayers and draftArch do not apply"),
    "algorithm": ({**TRAIN, "algorithm": "medusa"}, "spec.algorithm", 'Unsupported value: "medusa"'),
    "pvc verifier": ({**TRAIN, "verifier": {"model": "pvc://models/qwen"}}, "spec.verifier.model",
                     "use a hub id or s3://"),
    "repeated layers": ({**TRAIN, "draft": {"targetLayerIds": [2, 2, 9]}}, "spec.draft.targetLayerIds",
                        "must be distinct"),
    "server flag": ({**TRAIN, "hiddenStates": {"extraArgs": ["--kv-transfer-config={}"]}},
                    "spec.hiddenStates.extraArgs", "may not set flags the operator renders"),
    "regenerate with conversations": ({**TRAIN, "data": {"sources": ["hf:org/chats"],
                                                         "regenerate": {"dataset": "ultrachat"}}},
                                      "spec.data.sources", "cannot combine regenerated rows"),
    "output scheme": ({**TRAIN, "output": {"uri": "gs://bucket/x"}}, "spec.output.uri", "should match"),
}  # fmt: skip
CONVERT = {**{k: v for k, v in TRAIN.items() if k != "data"}, "algorithm": "eagle3",
           "convert": {"source": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}  # fmt: skip
TRAIN_BAD.update({
    "data and convert": ({**TRAIN, "convert": CONVERT["convert"]}, "spec", "exactly one of them"),
    "neither data nor convert": ({k: v for k, v in CONVERT.items() if k != "convert"}, "spec",
                                 "exactly one of them"),
    "convert peagle": ({**CONVERT, "algorithm": "peagle"}, "spec.algorithm", "converts eagle3 (SafeAILab"),
    "convert sets the shape": ({**CONVERT, "draft": {"numLayers": 2}}, "spec.draft", "keeps the source's shape"),
    "convert trains": ({**CONVERT, "training": {"nodes": 2}}, "spec.training", "is not trained"),
    "convert revision on s3": ({**CONVERT, "convert": {"source": "s3://drafts/eagle3", "revision": "v1"}},
                               "spec.convert.revision", "applies to a hub source"),
    "convert mtp layers": ({**CONVERT, "algorithm": "mtp", "draft": {"targetLayerIds": [3]}},
                           "spec.draft.targetLayerIds", "does not apply"),
    "convert norm on dflash": ({**CONVERT, "algorithm": "dflash",
                                "convert": {**CONVERT["convert"], "normBeforeResidual": True}},
                               "spec.convert.normBeforeResidual", "an eagle3 setting"),
    "convert scheme": ({**CONVERT, "convert": {"source": "gs://drafts/eagle3"}}, "spec.convert.source",
                       "should match"),
    "convert evaluated without prompts": ({**CONVERT, "evaluation": {"minAcceptance": 0.5}},
                                          "spec.evaluation.prompts", "a convert job has no data to hold out"),
    "held out everything": ({**TRAIN, "data": {"sources": ["hf:org/chats"], "maxSamples": 16},
                             "evaluation": {"heldOut": 16}}, "spec.evaluation.heldOut",
                            "must leave samples to train on"),
    "acceptance above 1": ({**TRAIN, "evaluation": {"minAcceptance": 1.5}}, "spec.evaluation.minAcceptance",
                           "should be less than or equal to 1"),
    "evaluation too short": ({**TRAIN, "evaluation": {"timeoutSeconds": 5}}, "spec.evaluation.timeoutSeconds",
                             "should be greater than or equal to 60"),
})  # fmt: skip
BAD.update({f"train: {case}": bad for case, bad in TRAIN_BAD.items()})

TEMPLATE = {k: v for k, v in TRAIN.items() if k != "verifier"}
STORAGE = {"location": "s3://captures/qwen"}
LEARNS = {**GOOD, "upgradePolicy": {"canary": {}, "trainTemplate": TEMPLATE}, "learning": {"storage": STORAGE}}


def learns(**over: dict[str, object]) -> dict[str, object]:
    """LEARNS with `over` merged into spec.learning's blocks (capture={...}, storage={...}, ...)."""
    blocks: dict[str, dict[str, object]] = {"storage": STORAGE}
    learning = {k: {**blocks.get(k, {}), **v} for k, v in over.items()}
    return {**LEARNS, "learning": {**blocks, **learning}}


BAD.update({
    "learning without a canary": ({**LEARNS, "upgradePolicy": {"trainTemplate": TEMPLATE}}, "spec.learning",
                                  "learning needs upgradePolicy.canary"),
    "learning without a template": ({**LEARNS, "upgradePolicy": {"canary": {}}}, "spec.learning",
                                    "learning needs upgradePolicy.trainTemplate"),
    "learning over nodes": ({**LEARNS, "serving": {"parallelism": {"tensor": 2, "nodes": 2}}}, "spec.learning",
                            "learning needs one node per replica"),
    "learning lossy": ({**LEARNS, "audit": {"allowLossy": True}}, "spec.learning",
                       "learning refuses audit.allowLossy"),
    "learning drift unmeasured": ({**learns(trigger={"drift": {}}), "serving": {"adaptiveVerification": True},
                                   "upgradePolicy": {"canary": {"metric": "MeanAcceptedLength"},
                                                     "trainTemplate": TEMPLATE}},
                                  "spec.learning.trigger.drift", "serving.adaptiveVerification does not measure"),
    "learning threshold with All": (learns(capture={"threshold": 0.3}), "spec.learning.capture.threshold",
                                    "applies to mode BelowThreshold only"),
    "learning on the hub": (learns(storage={"location": "hf://acme/captures"}), "spec.learning.storage.location",
                            "should match"),
    "learning without storage": ({**LEARNS, "learning": {"capture": {}}}, "spec.learning.storage",
                                 "Required value"),
    "learning fraction zero": (learns(capture={"fraction": 0}), "spec.learning.capture.fraction",
                               "capture.fraction must be at least 0.0001"),
    "learning cap zero": (learns(capture={"maxPerHour": 0}), "spec.learning.capture.maxPerHour",
                          "should be greater than or equal to 1"),
    "learning takes no captured share": (learns(training={"capturedShare": 0}), "spec.learning.training.capturedShare",
                                         "training.capturedShare must be at least 0.01"),
    "learning holds out too much": (learns(training={"heldOut": 0.6}), "spec.learning.training.heldOut",
                                    "should be less than or equal to 0.5"),
    "learning out of its claim": (learns(storage={"location": "pvc://captures/live/../../etc"}),
                                  "spec.learning.storage.location", "should match"),
    "learning with a capture variable": ({**LEARNS, "serving": {"env": [{"name": "SPECULATOR_CAPTURE_CONFIG",
                                                                         "value": "/tmp/mine.json"}]}},
                                         "spec.serving.env", "may not set SPECULATOR_CAPTURE_* variables"),
})  # fmt: skip


def test_learning_is_accepted_and_defaulted(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("learns", LEARNS))
    obj = json.loads(cluster.kubectl("get", "-n", namespace, "sdep/learns", "-o", "json").stdout)
    assert obj["spec"]["learning"] == {
        "capture": {"fraction": 0.1, "mode": "All", "maxPerHour": 3600},
        "storage": {"location": "s3://captures/qwen", "retentionDays": 30},
        "trigger": {"minNewSamples": 1000, "cooldownSeconds": 86400},
        "training": {"capturedShare": 0.5, "heldOut": 0.1},
    }
    # BelowThreshold without a threshold compares with 0.5 (the operator's default, not stored); drift over pvc://
    spec = learns(capture={"mode": "BelowThreshold", "redact": [{"pattern": "[0-9]{16}"}]},
                  storage={"location": "pvc://captures/qwen"}, trigger={"drift": {}})  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("worst", spec))
    learning = json.loads(cluster.kubectl("get", "-n", namespace, "sdep/worst", "-o", "json").stdout)["spec"][
        "learning"
    ]
    assert "threshold" not in learning["capture"]
    assert learning["capture"]["redact"] == [{"pattern": "[0-9]{16}"}]
    assert learning["trigger"]["drift"] == {"margin": 0.05, "windows": 3, "baselineWindows": 3}
    out = eventually(lambda: cluster.kubectl("explain", "sdep.spec.learning").stdout)
    assert "upgradePolicy.canary" in out  # what learning needs, with why, in the words explain wraps


def test_a_convert_job_is_accepted_without_data(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    spec = {**CONVERT, "draft": {"targetLayerIds": [1, 16, 29]},
            "convert": {**CONVERT["convert"], "revision": "main", "normBeforeResidual": True}}  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=stj("convert", spec))
    stored = json.loads(cluster.kubectl("get", "-n", namespace, "stj/convert", "-o", "json").stdout)["spec"]
    assert stored["convert"]["normBeforeResidual"] is True
    assert "data" not in stored


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_specs_are_rejected_with_field_level_messages(
    cluster: Cluster, operator_crds: list[str], namespace: str, case: str
) -> None:
    spec, field, message = BAD[case]
    manifest = stj("bad", spec) if case.startswith("train: ") else sdep("bad", spec)
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=manifest)
    assert out.returncode != 0
    assert field in out.stderr, out.stderr
    assert message in out.stderr, out.stderr


def test_what_a_run_was_started_with_is_immutable(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=stj("run", TRAIN))
    patch = json.dumps({"spec": {"training": {"epochs": 9}}})
    out = cluster.kubectl("patch", "-n", namespace, "stj/run", "--type=merge", "-p", patch, check=False)
    assert out.returncode != 0
    assert "spec.training: Invalid value" in out.stderr
    assert "immutable once the job exists" in out.stderr
    # what only steers later stages may change
    cluster.kubectl("patch", "-n", namespace, "stj/run", "--type=merge",
                    "-p", json.dumps({"spec": {"retries": 5, "deployTo": "qwen"}}))  # fmt: skip


def test_a_new_object_is_in_progress_for_kstatus_before_any_pass(
    cluster: Cluster, operator_crds: list[str], namespace: str, bin_dir: Path
) -> None:
    """No operator runs here: what Helm's and Flux's waits read between a create and the operator's first pass.
    Without a status, kstatus would call the object Current at once and `helm install --wait` would return."""
    for kind, manifest in (("sdep", sdep("new", GOOD)), ("stj", stj("new", TRAIN))):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
        obj = json.loads(cluster.kubectl("get", "-n", namespace, f"{kind}/new", "-o", "json").stdout)
        assert obj["status"] == {"observedGeneration": 0}
        done = subprocess.run([str(bin_dir / "gitops-check"), "kstatus"], input=json.dumps([obj]), text=True,
                              capture_output=True, timeout=60, check=True)  # fmt: skip
        assert json.loads(done.stdout)[0]["status"] == "InProgress"
