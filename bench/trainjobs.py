"""SpeculatorTrainJobs on the local control plane (prints figures; nothing is asserted).

- time from creating a SpeculatorTrainJob to its first stage's Job existing;
- the operator's latency between one stage finishing (its Job's Complete condition) and the next
  stage's first object (its Job, or the vLLM server it waits for) existing; target <= 2 s;
- the whole run with kwok playing each stage pod for 1 s.

Both are measured by one watch on Jobs and Deployments, so the watch's delivery delay is on both
sides of every difference. Run: hack/bench trainjobs   (N jobs at once with BENCH_N, default 20)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client, config, watch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from bench.deployments import free_port, lane_waits, metric_samples
from tests.ckptgen import SMALL_QWEN3 as SMALL

from speculator_harness import LocalCluster

NS = "bench-train"


def passes(port: int) -> str:
    """The train jobs' passes by outcome, and their mean duration (the operator's own counters)."""
    samples = metric_samples(port)
    count = {s.labels["outcome"]: s.value for s in samples
             if s.name == "speculator_passes_total" and s.labels.get("kind") == "SpeculatorTrainJob"}  # fmt: skip
    kind = [s for s in samples if s.labels.get("kind") == "SpeculatorTrainJob"]
    n = sum(s.value for s in kind if s.name == "speculator_reconcile_duration_seconds_count")
    total = sum(s.value for s in kind if s.name == "speculator_reconcile_duration_seconds_sum")
    mean = total / n if n else 0.0
    return f"{', '.join(f'{k} {v:.0f}' for k, v in sorted(count.items()))}; mean plan-and-apply {mean:.3f} s"


ORDER = ["fetch", "prepare", "extract", "train", "audit", "publish"]


class Recorder(threading.Thread):
    """Local receive times: a stage's first object appearing, and its Job completing."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.first: dict[tuple[str, str], float] = {}  # (job name, stage) -> first object seen
        self.done: dict[tuple[str, str], float] = {}  # (job name, stage) -> Job Complete seen
        self.stop = threading.Event()

    def _watch(self, list_fn: Any, kind: str) -> None:
        try:
            self._stream(list_fn, kind)
        except Exception:  # the cluster stops under the watch at the end
            if not self.stop.is_set():
                raise

    def _stream(self, list_fn: Any, kind: str) -> None:
        w = watch.Watch()
        for event in w.stream(list_fn, NS, label_selector="speculators.dev/trainjob", timeout_seconds=0):
            now = time.monotonic()
            obj = event["object"]
            labels = obj.metadata.labels or {}
            key = (labels.get("speculators.dev/trainjob", ""), labels.get("speculators.dev/stage", ""))
            stage = "extract" if key[1] == "extractor" else key[1]  # the server belongs to the extract stage
            self.first.setdefault((key[0], stage), now)
            if kind == "job":
                conds = {c.type for c in (obj.status.conditions or []) if c.status == "True"}
                if "Complete" in conds:
                    self.done.setdefault(key, now)
            if self.stop.is_set():
                w.stop()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._watch, args=(client.BatchV1Api(self.api).list_namespaced_job, "job"),
                             daemon=True),
            threading.Thread(target=self._watch,
                             args=(client.AppsV1Api(self.api).list_namespaced_deployment, "deployment"), daemon=True),
        ]  # fmt: skip
        for t in threads:
            t.start()
        self.stop.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "20")))
    args = parser.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        local = LocalCluster(root / "cluster", args.bin_dir, log=lambda m: None)
        info = local.start()
        op = None
        try:
            os.environ.update(info.env())
            config.load_kube_config(config_file=str(info.kubeconfig))
            api = client.ApiClient()
            core = client.CoreV1Api(api)
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket="bench")
            s3.put_object(Bucket="bench", Key="verifier/config.json", Body=json.dumps(SMALL).encode())
            s3.put_object(Bucket="bench", Key="data/rows.jsonl", Body=b'{"input_ids": [1, 2], "loss_mask": [0, 1]}\n')
            kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
            crds = str(Path(__file__).resolve().parents[1] / "crds")
            subprocess.run([*kubectl, "apply", "--server-side", "-f", crds], check=True, capture_output=True)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
            assert info.s3 is not None
            core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="s3"),
                                                              string_data=info.s3.env()))  # fmt: skip
            for i in [*range(n), "warm"]:  # what a storage provisioner would make for each workspace claim
                core.create_persistent_volume(client.V1PersistentVolume(
                    metadata=client.V1ObjectMeta(name=f"bench-ws-{i}"),
                    spec=client.V1PersistentVolumeSpec(
                        capacity={"storage": "1Ti"}, access_modes=["ReadWriteMany"],
                        host_path=client.V1HostPathVolumeSource(path=f"/tmp/bench-ws-{i}"),  # noqa: S108 - kwok: no pod
                        claim_ref=client.V1ObjectReference(namespace=NS, name=f"t{i}-workspace"))))  # fmt: skip
            port = free_port()
            env = {**os.environ, "KUBECONFIG": str(info.kubeconfig), "SPECULATOR_METRICS_PORT": str(port)}
            log = open(root / "operator.log", "wb")  # noqa: SIM115
            op = subprocess.Popen(["speculator-operator", "run", "--standalone", "--namespace", NS], env=env,
                                  stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            recorder = Recorder(api)
            recorder.start()
            objects = client.CustomObjectsApi(api)
            spec = {"verifier": {"model": "s3://bench/verifier", "credentials": {"name": "s3"}},
                    "algorithm": "eagle3", "retries": 0,
                    "data": {"sources": ["s3://bench/data/rows.jsonl"], "format": "pretokenized"},
                    "output": {"uri": "s3://bench/out", "credentials": {"name": "s3"}}}  # fmt: skip
            # a warm operator is measured: one job first, until its first stage's Job exists
            objects.create_namespaced_custom_object("speculators.dev", "v1alpha1", NS, "speculatortrainjobs",
                {"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorTrainJob",
                 "metadata": {"name": "twarm"}, "spec": spec})  # fmt: skip
            while ("twarm", "fetch") not in recorder.first:
                time.sleep(0.1)
            created: dict[str, float] = {}
            t0 = time.monotonic()
            for i in range(n):
                created[f"t{i}"] = time.monotonic()
                objects.create_namespaced_custom_object("speculators.dev", "v1alpha1", NS, "speculatortrainjobs",
                    {"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorTrainJob",
                     "metadata": {"name": f"t{i}"}, "spec": spec})  # fmt: skip
            while True:
                items = objects.list_namespaced_custom_object("speculators.dev", "v1alpha1", NS,
                                                              "speculatortrainjobs")["items"]  # fmt: skip
                phases = [(it.get("status") or {}).get("phase") for it in items if it["metadata"]["name"] != "twarm"]
                if all(p in ("Succeeded", "Failed") for p in phases) and len(phases) == n:
                    break
                if time.monotonic() - t0 > 1800:
                    raise TimeoutError("not all train jobs finished within 1800 s")
                time.sleep(0.5)
            total = time.monotonic() - t0
            recorder.stop.set()
            failed = phases.count("Failed")
            first = [recorder.first[(name, "fetch")] - t for name, t in created.items() if (name, "fetch") in
                     recorder.first]  # fmt: skip
            gaps = []
            for name in created:
                for before, after in itertools.pairwise(ORDER):
                    if (name, before) in recorder.done and (name, after) in recorder.first:
                        gaps.append(recorder.first[(name, after)] - recorder.done[(name, before)])
            print(f"{n} SpeculatorTrainJobs at once (offline: {len(ORDER)} stages; kwok ends each stage pod after 1 s)")
            print(f"  all finished in {total:.1f} s; failed: {failed}")
            print(f"  create -> first stage's Job: median {statistics.median(first):.2f} s, "
                  f"p95 {pct(first, 0.95):.2f} s, max {max(first):.2f} s")  # fmt: skip
            print(f"  stage finished -> next stage's first object ({len(gaps)} transitions): median "
                  f"{statistics.median(gaps):.2f} s, p95 {pct(gaps, 0.95):.2f} s, max {max(gaps):.2f} s "
                  "(target <= 2 s)")  # fmt: skip
            # where the wait goes: a key's wait for a worker of its queue, and the passes themselves
            print(f"  {lane_waits(port)}")
            print(f"  passes: {passes(port)}")
        finally:
            if op is not None:
                op.terminate()
                op.wait(30)
            local.stop()


if __name__ == "__main__":
    main()
