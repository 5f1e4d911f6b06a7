"""Live progress read from a real pod's log on the real node: the operator's progress reader finds the running
stage pod of a SpeculatorTrainJob, reads its log tail through the API server (pods/log, which the kubelet
serves), takes the last trustworthy `speculators-progress` line among garbage, writes status.progress only
when it moved (cause `progress`), and tells each epoch's end. The pod prints what the trainer entrypoint
prints (speculator_operator.pods.progress.Tracker.render); that the entrypoint prints it from speculators' real
log lines is tests/workloads/test_progress_format.py and tests/unit/test_progress.py."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.controllers import trainjob
from speculator_operator.domain.releases import get_release
from speculator_operator.render.serving import CONTAINER_SECURITY, POD_SECURITY
from speculator_operator.runtime import kube

from .conftest import Cluster, eventually, get
from .test_status_writes import writes

pytestmark = [pytest.mark.cluster, pytest.mark.node]
ON_NODE = {
    "nodeSelector": {"speculators.dev/real-node": "true"},
    "tolerations": [{"key": "speculators.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}],
}
# one progress line a second, step by step, with garbage between; the first epoch ends at step 5
PRINTER = """
import json, sys, time
for step in range(600):
    done = 1 if step >= 5 else 0
    line = {"stage": "train", "step": step, "epoch": done + 1, "epochs": 2, "epochsCompleted": done or None,
            "loss": 3.0 - step / 100, "metrics": {"train/loss": 3.0 - step / 100}}
    print("speculators-progress " + json.dumps({k: v for k, v in line.items() if v is not None}), flush=True)
    print('speculators-progress {"stage": "train", "step": "garbage', flush=True)
    print("speculators-progress " + json.dumps({"stage": "prepare", "samples": 10**9}), flush=True)
    time.sleep(1)
"""


def train_writes() -> float:
    return writes("progress", kind="SpeculatorTrainJob")


def test_progress_moves_in_status_from_a_real_pods_log(
    cluster: Cluster, operator_crds: list[str], namespace: str, real_node: str
) -> None:
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube.load_config()
    objects = kube.client.CustomObjectsApi(kube.api())
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SpeculatorTrainJob", "metadata": {"name": "tiny"},
            "spec": {"verifier": {"model": "s3://models/tiny"}, "algorithm": "eagle3",
                     "data": {"sources": ["s3://data/rows.jsonl"]}, "output": {"uri": "s3://drafts/tiny"}}}  # fmt: skip
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "speculatortrainjobs", body)
    # no operator runs here: the stage machine's place is taken by hand
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "speculatortrainjobs", "tiny",
                                                  {"status": {"phase": "Training", "stage": "train"}})  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tiny-train-0", "labels": {"speculators.dev/trainjob": "tiny",
                                                        "speculators.dev/stage": "train"}},
        "spec": {**ON_NODE, "securityContext": POD_SECURITY, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": get_release().image("trainer"),
                                 "imagePullPolicy": "IfNotPresent", "command": ["python", "-c", PRINTER],
                                 "securityContext": CONTAINER_SECURITY}]},
    }  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/tiny-train-0", "--timeout=300s",
                    timeout=320)  # fmt: skip
    assert get(cluster, namespace, "pod/tiny-train-0")["spec"]["nodeName"] == real_node

    before = train_writes()
    events: list[tuple[str, str]] = []

    def read() -> dict[str, Any]:
        # what the operator does: the periodic lane reads the log and holds what it found, then the object's
        # pass (its only cause: the progress) folds it into the status
        if trainjob.read_progress(get(cluster, namespace, "stj/tiny")):
            events.extend(trainjob.fold_progress(namespace, "tiny"))
        return dict(get(cluster, namespace, "stj/tiny")["status"].get("progress") or {})

    first = eventually(lambda: _has_step(read()), timeout=60, interval=1)
    t0 = time.monotonic()
    moved = eventually(lambda: _past(read(), first["step"] + 2), timeout=60, interval=1)
    assert moved["stage"] == "train"
    assert moved["loss"] < first["loss"]  # the loss the pod reported, not the garbage after it
    assert moved["metrics"] == {"train/loss": moved["loss"]}
    assert "samples" not in moved  # another stage's line is not this stage's progress
    assert moved["updated"] >= first["updated"]
    later = eventually(lambda: _past(read(), 6), timeout=60, interval=1)
    assert later["epochsCompleted"] == 1
    assert [reason for reason, _ in events] == ["EpochCompleted"]  # once, when the pod first showed it
    assert events[0][1].startswith("epoch 1/2 completed, train/loss ")
    # one write per read that saw something new: never more writes than reads
    reads = time.monotonic() - t0
    assert 2 <= train_writes() - before <= reads + 2
    # nothing new since the last read: nothing written
    stored = get(cluster, namespace, "stj/tiny")["status"]["progress"]
    cluster.kubectl("delete", "-n", namespace, "pod/tiny-train-0", "--wait=true", timeout=120)
    count = train_writes()
    assert trainjob.read_progress(get(cluster, namespace, "stj/tiny")) is False  # no running pod: nothing to read
    assert trainjob.fold_progress(namespace, "tiny") == []
    assert train_writes() == count
    assert get(cluster, namespace, "stj/tiny")["status"]["progress"] == stored


def _has_step(found: dict[str, Any]) -> dict[str, Any]:
    assert "step" in found, found
    return found


def _past(found: dict[str, Any], step: int) -> dict[str, Any]:
    assert found.get("step", -1) >= step, found
    return found
