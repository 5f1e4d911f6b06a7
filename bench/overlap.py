"""Triggers that overlap at one SpeculatorDeployment, against this operator or an earlier one from the repository's
history (prints figures; nothing is asserted).

The scenario of tests/cluster/test_one_pass.py without its hook, so that it runs against any version: a spec edit
(a new `--seed` argument) and a hand scale of the child in the same breath, every round; the draft's bytes
replaced in place every third round, which the input poll (every 30 s, the least upgradePolicy allows) turns
into a redeploy. Printed: the child's template revisions in the order the API server reported them, how often a
revision came back after another had replaced it (A -> B -> A), how far the child's generation rose against the
revisions it served, the API server's own count of 409 answers to the kind's status writes, the operator's
status writes and restorations, and whether it ended serving the last inputs.

Run: hack/bench overlap              (this checkout's operator)
     BENCH_REF=fe501e0 hack/bench overlap   (the operator as it was at that commit: `git archive`)
     BENCH_ROUNDS=20 (default)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client, watch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster import local_cluster, stop
from bench.deployments import stamp, writes
from tests.ckptgen import SMALL_QWEN3 as SMALL
from tests.ckptgen import eagle3, write_checkpoint

REPO = Path(__file__).resolve().parents[1]
NS = "bench-overlap"
REVISION = "speculators.dev/revision"


class Templates(threading.Thread):
    """The child Deployment's template revision and generation after every change the API server reports."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(daemon=True)
        self.apps = client.AppsV1Api(api)
        self.seen: list[str] = []
        self.generation = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for event in watch.Watch().stream(self.apps.list_namespaced_deployment, NS, timeout_seconds=30):
                    dep = event["object"]
                    if dep.metadata.name != "overlap":
                        continue
                    self.generation = max(self.generation, dep.metadata.generation or 0)
                    revision = (dep.spec.template.metadata.annotations or {}).get(REVISION)
                    if revision and (not self.seen or self.seen[-1] != revision):
                        self.seen.append(revision)
                    if self.stop.is_set():
                        return
            except Exception:  # a dropped watch is started again
                time.sleep(0.5)


def returns(seen: list[str]) -> int:
    """How often a revision came back after another had replaced it."""
    return sum(1 for i in range(2, len(seen)) if seen[i] in seen[: i - 1])


def status_conflicts(kubectl: list[str]) -> float:
    """The API server's count of 409 answers to the kind's status writes (its own /metrics)."""
    out = subprocess.run([*kubectl, "get", "--raw", "/metrics"], check=True, capture_output=True, text=True).stdout
    total = 0.0
    for line in out.splitlines():
        if (line.startswith("apiserver_request_total{") and 'resource="speculatordeployments"' in line
                and 'subresource="status"' in line and 'code="409"' in line):  # fmt: skip
            total += float(line.rsplit(" ", 1)[1])
    return total


def operator_package(ref: str | None, root: Path) -> Path:
    """The operator package to run: this checkout's, or the one at `ref` from the repository's history."""
    if not ref:
        return REPO / "operator"
    found = subprocess.run(["git", "-C", str(REPO), "archive", ref, "operator"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(found.stdout)) as archive:
        archive.extractall(root / "old", filter="data")
    return root / "old" / "operator"


def upload_draft(s3: Any, folder: Path, fill: int) -> None:
    write_checkpoint(folder, *eagle3(SMALL, draft_vocab=1024), sparse=False, fill=bytes([fill]))
    for path in sorted(folder.iterdir()):
        s3.upload_file(str(path), "bench", f"draft/{path.name}")


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("--ref", default=os.environ.get("BENCH_REF"), help="an earlier commit's operator")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "20")))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, local_cluster(Path(tmp), args.bin_dir) as info:
        root = Path(tmp)
        op: subprocess.Popen[bytes] | None = None
        try:
            api = client.ApiClient()
            kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
            subprocess.run([*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")], check=True,
                           capture_output=True)  # fmt: skip
            core = client.CoreV1Api(api)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
            assert info.s3 is not None
            core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="s3"),
                                                              string_data=info.s3.env()))  # fmt: skip
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket="bench")
            s3.put_object(Bucket="bench", Key="verifier/config.json", Body=json.dumps(SMALL).encode())
            upload_draft(s3, root / "draft", 0)

            package = operator_package(args.ref, root)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATOR_")}
            env.update(KUBECONFIG=str(info.kubeconfig), PYTHONPATH=str(package))
            log = open(root / "operator.log", "wb")  # noqa: SIM115
            run = ["run", "--standalone", "--namespace", NS, "-m", "speculator_operator.controllers"]
            op = subprocess.Popen([sys.executable, "-m", "kopf", *run], env=env, stdout=log, stderr=subprocess.STDOUT)
            templates = Templates(api)
            templates.start()
            doc = {
                "apiVersion": "speculators.dev/v1alpha1",
                "kind": "SpeculatorDeployment",
                "metadata": {"name": "overlap"},
                "spec": {
                    "verifier": {"model": "s3://bench/verifier", "credentials": {"name": "s3"}},
                    "speculator": {"source": "s3://bench/draft", "credentials": {"name": "s3"}},
                    "serving": {"replicas": 1},
                    "upgradePolicy": {"onDraftChange": "Redeploy", "pollIntervalSeconds": 30},
                },
            }
            subprocess.run([*kubectl, "apply", "-n", NS, "-f", "-"], input=json.dumps(doc).encode(), check=True,
                           capture_output=True)  # fmt: skip
            subprocess.run([*kubectl, "wait", "-n", NS, "--for=condition=Ready", "sdep/overlap", "--timeout=180s"],
                           check=True, capture_output=True)  # fmt: skip
            time.sleep(2)
            since, conflicts0 = stamp(), status_conflicts(kubectl)
            generation0, revisions0 = templates.generation, len(templates.seen)
            t0 = time.monotonic()
            fills = 0
            for r in range(args.rounds):
                patch = {"spec": {"serving": {"extraArgs": ["--seed", str(r)]}}}
                subprocess.run([*kubectl, "patch", "-n", NS, "sdep/overlap", "--type=merge", "-p", json.dumps(patch)],
                               check=True, capture_output=True)  # fmt: skip
                subprocess.run([*kubectl, "scale", "-n", NS, "deployment/overlap", "--replicas=3"],
                               check=True, capture_output=True)  # fmt: skip
                if r % 3 == 2:
                    fills += 1
                    upload_draft(s3, root / "draft", fills)
                time.sleep(1.0)
            took = time.monotonic() - t0
            # the last draft's poll, and the restorations, settle
            settle = time.monotonic()
            while time.monotonic() - settle < 45:
                time.sleep(1)
            dep = client.AppsV1Api(api).read_namespaced_deployment("overlap", NS)
            sdep = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "speculators.dev", "v1alpha1", NS, "speculatordeployments", "overlap")  # fmt: skip
            audit = writes(info.audit_log or Path(), since)  # type: ignore[arg-type]
            conflicts = status_conflicts(kubectl) - conflicts0
            seen = templates.seen[revisions0 - 1 if revisions0 else 0 :]
            events = core.list_namespaced_event(NS, field_selector="reason=ChildRestored").items
            print(f"operator: {args.ref or 'this checkout'}; {args.rounds} rounds in {took:.0f} s (a spec edit and "
                  f"a hand scale each, the draft's bytes replaced {fills} times, poll every 30 s)")  # fmt: skip
            print(f"child template revisions, in order: {len(seen)} ({len(set(seen))} distinct); "
                  f"a revision back after another replaced it (A -> B -> A): {returns(seen)}")  # fmt: skip
            print(f"child generation +{templates.generation - generation0}; replicas now {dep.spec.replicas} "
                  f"(spec 1); serving --seed {args.rounds - 1}: "
                  f"{str(args.rounds - 1) in (dep.spec.template.spec.containers[0].args or [])}")  # fmt: skip
            print(f"status writes {audit.get('speculatordeployments/status', 0)}, "
                  f"API server 409s to status writes {conflicts:.0f}, ChildRestored events {len(events)}, "
                  f"status phase {(sdep.get('status') or {}).get('phase')}")  # fmt: skip
        finally:
            stop(op)


if __name__ == "__main__":
    main()
