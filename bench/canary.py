"""Canaries at scale (prints figures; nothing is asserted).

N SpeculatorDeployments × 1 replica with `upgradePolicy.canary` (30 s intervals, 2 in a row decide) on stand-in
nodes whose pods are answered here with real vLLM metrics text (bench/acceptance.py). All get a new draft at once
(a spec edit to s3://bench/draft2): N canaries analysed together, the even ones' candidates accepted as well as
their incumbents (promoted), the odd ones' never accepted (rolled back). Printed:

- the time until every canary is Analyzing;
- over the analysis: the operator's CPU (share of one core) and peak RSS, scrapes answered per second, and its
  writes per deployment per interval (status, children; the API server's audit log);
- per deployment, the time from the end of its deciding interval (`status.canary.analyzedUntil`, written to the
  second) to the verdict seen by the bench (polling each second), median and max; and until every verdict.

Run: hack/bench canary   (N with BENCH_N, default 100)
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from acceptance import SPEC, bench_cluster
from deployments import stamp, writes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ckptgen import SMALL_QWEN3 as SMALL
from tests.ckptgen import eagle3, write_checkpoint

NS = "bench-canary"
INTERVAL = 30
POLICY = {"intervalSeconds": INTERVAL, "minDrafts": 100, "promoteAfter": 2, "rollbackAfter": 2}
TRACK = "speculators.dev/track"


def canary(item: dict[str, Any]) -> dict[str, Any]:
    return (item.get("status") or {}).get("canary") or {}


def seconds(stamp_: str) -> float:
    return datetime.strptime(stamp_, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "100")))
    args = parser.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory() as tmp, bench_cluster(Path(tmp), args.bin_dir, 2 * n + n // 2, NS) as b:
        # the new draft: the same config, other weights (so another revision)
        write_checkpoint(Path(tmp) / "draft2", *eagle3(SMALL, draft_vocab=1024), sparse=False, fill=b"\x02")
        s3 = boto3.client("s3")
        for f in (Path(tmp) / "draft2").iterdir():
            s3.upload_file(str(f), "bench", f"draft2/{f.name}")
        serving = {"replicas": 1, "nodeSelector": {"speculators.dev/standin": "true"}}
        for i in range(n):
            b.create(f"d{i}", {**SPEC, "serving": serving, "upgradePolicy": {"canary": POLICY}})
        ready = b.wait("all Ready", lambda its: sum(1 for it in its if it.get("status", {}).get("phase") == "Ready")
                       >= n, 1800)  # fmt: skip
        k = int(b.items()[0]["status"]["numSpeculativeTokens"])
        for pod in b.core.list_namespaced_pod(NS).items:
            b.stand_ins.add(pod.status.pod_ip, k)

        since, cpu0, t0 = stamp(), b.proc.cpu_times(), time.monotonic()
        scrapes0 = sum(p.scrapes for p in b.stand_ins.pods.values())
        patch = {"spec": {"speculator": {"source": "s3://bench/draft2"}}}
        for i in range(n):
            b.objects.patch_namespaced_custom_object(
                "speculators.dev", "v1alpha1", NS, "speculatordeployments", f"d{i}", patch
            )
        analyzing = b.wait("every canary Analyzing", lambda its: sum(1 for it in its if canary(it)) >= n, 600)
        answered: set[str] = set()
        decided: dict[str, float] = {}  # name -> seconds from the deciding interval's end to the verdict seen
        peak = 0
        while len(decided) < n:
            if time.monotonic() - t0 > 900:
                raise TimeoutError(f"{n - len(decided)} canaries without a verdict within 900 s")
            for pod in b.core.list_namespaced_pod(NS, label_selector=f"{TRACK}=canary").items:
                ip = pod.status.pod_ip
                if ip and ip not in answered and not pod.metadata.deletion_timestamp:
                    answered.add(ip)
                    b.stand_ins.add(ip, k)
                    owner = int(pod.metadata.labels["speculators.dev/deployment"].removeprefix("d"))
                    b.stand_ins.pods[ip].agree = owner % 2 == 0
            seen = time.time()
            for it in b.items():
                c, name = canary(it), it["metadata"]["name"]
                if c.get("verdict") and name not in decided:
                    decided[name] = seen - seconds(c["analyzedUntil"])
            peak = max(peak, b.proc.memory_info().rss)
            time.sleep(1)
        span = time.monotonic() - t0
        cpu1, scrapes1 = b.proc.cpu_times(), sum(p.scrapes for p in b.stand_ins.pods.values())
        cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / span
        written = writes(b.info.audit_log or Path(), since)
        items = b.items()
        verdicts = [canary(it).get("verdict") for it in items]
        right = sum(
            1 for it in items if canary(it).get("verdict") == ("Promoted" if int(it["metadata"]["name"][1:]) % 2 == 0
                                                               else "RolledBack")
        )  # fmt: skip
        intervals = span / INTERVAL
        lags = sorted(decided.values())
        print(
            f"{n} SpeculatorDeployments × 1 replica + 1 canary each on stand-in nodes, scraped every 15 s, "
            f"{INTERVAL} s intervals, 2 in a row decide"
        )
        print(f"  all Ready in {ready:.1f} s; every canary Analyzing {analyzing:.1f} s after the spec edits")
        print(
            f"  verdicts: {verdicts.count('Promoted')} promoted, {verdicts.count('RolledBack')} rolled back "
            f"({right}/{n} as scripted), every one {span:.1f} s after the spec edits"
        )
        print(
            f"  deciding interval's end -> verdict seen: median {statistics.median(lags):.1f} s, max {lags[-1]:.1f} s "
            "(the interval's end is written to the second)"
        )
        print(
            f"  over those {span:.0f} s: operator CPU {100 * cpu:.1f}% of one core, peak RSS {peak / 2**20:.0f} MiB, "
            f"{(scrapes1 - scrapes0) / span:.1f} scrapes/s answered"
        )
        per = {what: written[what] / n / intervals for what in ("speculatordeployments/status", "deployments")}
        print(
            f"  writes per deployment per interval: status {per['speculatordeployments/status']:.2f}, deployments "
            f"{per['deployments']:.2f} (all writes by resource: {dict(written)})"
        )


if __name__ == "__main__":
    main()
