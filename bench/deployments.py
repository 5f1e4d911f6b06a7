"""SpeculatorDeployments at scale on the local control plane (prints figures; nothing is asserted).

- time until N SpeculatorDeployments are Ready with the operator, against a bare client that creates
  the same children (rendered the same way) in the same run: the ratio is the operator's overhead
  (audits, status, events) over the minimum;
- API writes per resource by the operator (counted in the API server's audit log);
- writes during an idle period longer than the operator's resync, from when every resource has its first
  acceptance measure in status (target 0);
- the operator's peak RSS (and, with BENCH_PROFILE=1, a separate run's allocations by package; with
  BENCH_PROFILE=census, this run's allocator figures and live objects by type once all are Ready).

Run: hack/bench deployments   (N with BENCH_N, default 200)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import psutil
from kubernetes import client, config, watch
from kubernetes.dynamic import DynamicClient
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ckptgen import SMALL_QWEN3 as SMALL
from tests.ckptgen import eagle3, write_checkpoint

from speculator_harness import LocalCluster
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.render.serving import Draft, Inputs, render

AGENTS = ("kopf/", "OpenAPI-Generator/")


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def writes(audit_log: Path, since: str, until: str | None = None, refused: bool = False) -> collections.Counter[str]:
    """The operator's writes by resource (with `refused`: the ones the API server refused instead, such as a
    409 on a stale resourceVersion, which the writer reads again and retries: no change was stored)."""
    count: collections.Counter[str] = collections.Counter()
    for line in audit_log.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line the API server is writing now
        t = e["requestReceivedTimestamp"]
        if e.get("stage") != "ResponseComplete" or t < since or (until and t > until):
            continue
        code = (e.get("responseStatus") or {}).get("code") or 0
        if refused != (code >= 400):
            continue
        if e["verb"] in ("create", "update", "patch", "delete") and e.get("userAgent", "").startswith(AGENTS):
            ref = e.get("objectRef", {})
            count[ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")] += 1
    return count


def status_writes_before_ready(audit_log: Path, since: str, ready_at: dict[str, str]) -> collections.Counter[str]:
    """Each resource's status writes by the operator before the bench saw that resource Ready."""
    count: collections.Counter[str] = collections.Counter()
    for line in audit_log.read_text().splitlines():
        e = json.loads(line)
        ref = e.get("objectRef", {})
        if (e.get("stage") != "ResponseComplete" or e["requestReceivedTimestamp"] < since
                or ref.get("resource") != "speculatordeployments" or ref.get("subresource") != "status"
                or e["verb"] != "patch" or not e.get("userAgent", "").startswith(AGENTS)
                or ((e.get("responseStatus") or {}).get("code") or 0) >= 400):  # fmt: skip
            continue
        name = ref.get("name", "")
        if e["requestReceivedTimestamp"] < ready_at.get(name, "~"):
            count[name] += 1
    return count


def upload_pair(root: Path) -> None:
    """A small EAGLE-3 draft at s3://bench/draft and its verifier's config at s3://bench/verifier."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bench")
    c, t = eagle3(SMALL, draft_vocab=1024)
    write_checkpoint(root / "draft", c, t, sparse=False)
    for f in (root / "draft").iterdir():
        s3.upload_file(str(f), "bench", f"draft/{f.name}")
    s3.put_object(Bucket="bench", Key="verifier/config.json", Body=json.dumps(SMALL).encode())


def wait_ready(apps: client.AppsV1Api, namespace: str, n: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        items = apps.list_namespaced_deployment(namespace).items
        ready = sum(
            1 for d in items if (d.status.ready_replicas or 0) >= (d.spec.replicas or 0) and d.status.ready_replicas
        )
        if ready >= n:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise TimeoutError(f"{namespace}: not all {n} ready within {timeout} s")


class ReadyTimes(threading.Thread):
    """When each object of a kind in the namespace first looked ready, by a watch of its own (the bench's
    view, not the operator's)."""

    def __init__(self, list_fn: Any, ready: Any, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.list_fn, self.ready, self.kwargs = list_fn, ready, kwargs
        self.first: dict[str, float] = {}
        self.at: dict[str, str] = {}  # the same moments on the wall clock, to compare with the audit log's
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for event in watch.Watch().stream(self.list_fn, timeout_seconds=30, **self.kwargs):
                    obj = event["object"]
                    obj = obj if isinstance(obj, dict) else client.ApiClient().sanitize_for_serialization(obj)
                    name = obj["metadata"]["name"]
                    if name not in self.first and self.ready(obj):
                        self.first[name] = time.monotonic()
                        self.at[name] = stamp()
                    if self.stop.is_set():
                        return
            except Exception:  # a dropped watch is started again; the bench goes on
                time.sleep(0.5)


def deployment_ready(d: dict[str, Any]) -> bool:
    want = (d.get("spec") or {}).get("replicas") or 0
    return bool(want) and ((d.get("status") or {}).get("readyReplicas") or 0) >= want


def resource_ready(r: dict[str, Any]) -> bool:
    status = r.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return status.get("phase") == "Ready" and ready.get("status") == "True"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def kinds_of(total: collections.Counter[str]) -> dict[str, int]:
    """Operator writes by what they are for."""
    out = {
        "children": sum(total[k] for k in ("deployments", "services", "poddisruptionbudgets")),
        "status": total["speculatordeployments/status"],
        "bookkeeping on the resource (kopf's annotations, finalizers)": total["speculatordeployments"],
        "events (not counted)": total["events"],
        "permission checks at start (not stored)": total["selfsubjectaccessreviews"],
    }
    counted = {"deployments", "services", "poddisruptionbudgets", "speculatordeployments/status",
               "speculatordeployments", "events", "selfsubjectaccessreviews"}  # fmt: skip
    out["other"] = sum(v for k, v in total.items() if k not in counted)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric_samples(port: int) -> list[Any]:
    """Every sample the operator's /metrics serves now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def listed(objects: Any) -> list[dict[str, Any]]:
    """The bench's SpeculatorDeployments as the API server holds them now."""
    items: list[dict[str, Any]] = objects.list_namespaced_custom_object(
        "speculators.dev", "v1alpha1", "bench-operator", "speculatordeployments"
    )["items"]
    return items


def status_writes_by_cause(port: int) -> dict[str, int]:
    """The operator's own count of its stored status writes, by what asked for them."""
    return {
        s.labels["cause"]: int(s.value)
        for s in metric_samples(port)
        if s.name == "speculator_status_writes_total" and s.labels.get("kind") == "SpeculatorDeployment"
    }


def histograms(port: int, metric: str, by: str) -> str:
    """One of the operator's histograms, by the label `by`: count, mean, over 1 s, over 5 s."""
    series: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for s in metric_samples(port):
        if not s.name.startswith(metric + "_"):
            continue
        key = s.name.removeprefix(metric + "_") + s.labels.get("le", "")
        series[s.labels.get(by, "-")][key] = s.value
    out = []
    for label, v in sorted(series.items()):
        n = v.get("count", 0)
        mean = v.get("sum", 0) / n if n else 0
        out.append(f"{label} {n:.0f} (mean {mean:.3f} s, over 1 s {n - v.get('bucket1.0', n):.0f}, "
                   f"over 5 s {n - v.get('bucket5.0', n):.0f})")  # fmt: skip
    return "; ".join(out)


def lane_waits(port: int) -> str:
    """How long the operator's work waited for a thread, by pool (quick-<Kind>: keys with quick causes only),
    how long its passes took by lane, and how late its event loop woke."""
    return (
        f"waits for a thread: {histograms(port, 'speculator_lane_wait_seconds', 'lane')}\n"
        f"  passes: {histograms(port, 'speculator_pass_duration_seconds', 'lane')}\n"
        f"  event loop late: {histograms(port, 'speculator_event_loop_lag_seconds', 'lane')}"
    )


def main() -> None:
    # a terminated benchmark still stops the processes it started (the finally blocks run)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "200")))
    parser.add_argument("--idle", type=float, default=75.0, help="idle seconds to watch for writes (> resync)")
    args = parser.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        local = LocalCluster(root / "cluster", args.bin_dir, gpu_nodes=max(2, n // 4), log=lambda m: None)
        info = local.start()
        op: subprocess.Popen[bytes] | None = None
        try:
            os.environ.update(info.env())
            config.load_kube_config(config_file=str(info.kubeconfig))
            api = client.ApiClient()
            api.user_agent = "speculator-bench"  # its own creates are not the operator's writes
            core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
            upload_pair(root)
            crds = str(Path(__file__).resolve().parents[1] / "crds")
            kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
            subprocess.run([*kubectl, "apply", "--server-side", "-f", crds], check=True, capture_output=True)
            for ns in ("bench-operator", "bench-bare"):
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            assert info.s3 is not None
            core.create_namespaced_secret("bench-operator", client.V1Secret(
                metadata=client.V1ObjectMeta(name="s3"), string_data=info.s3.env()))  # fmt: skip
            spec = {"verifier": {"model": "s3://bench/verifier", "credentials": {"name": "s3"}},
                    "speculator": {"source": "s3://bench/draft", "credentials": {"name": "s3"}},
                    "serving": {"replicas": 1}}  # fmt: skip

            # the bare client: the same children, rendered the same way, applied directly
            dyn = DynamicClient(api)
            parsed = SpeculatorDeploymentSpec.model_validate(spec)
            t0 = time.monotonic()
            for i in range(n):
                r = render(Inputs(f"d{i}", "bench-bare", parsed, get_release(), Draft("eagle3", 3)))
                for child in r.children:
                    res = dyn.resources.get(api_version=child["apiVersion"], kind=child["kind"])
                    res.server_side_apply(body=child, name=child["metadata"]["name"], namespace="bench-bare",
                                          field_manager="bench", force_conflicts=True)  # fmt: skip
            bare = (time.monotonic() - t0) + wait_ready(apps, "bench-bare", n, 900)

            port = free_port()
            env = {**os.environ, "KUBECONFIG": str(info.kubeconfig), "SPECULATOR_METRICS_PORT": str(port),
                   "SPECULATOR_METRICS_ADDRESS": "127.0.0.1"}  # fmt: skip
            # BENCH_PROFILE=1: the operator traces its allocations (slower: its figures are not the run's), and
            # the bench prints where the memory is once all are Ready; BENCH_PROFILE=census: no tracing, the
            # allocators' figures and the live objects by type at that moment (the run's figures stand)
            mode = os.environ.get("BENCH_PROFILE")
            profile = root / "profile.txt" if mode else None
            if profile is not None:
                env["SPECULATOR_PROFILE"] = str(profile)
                env["SPECULATOR_PROFILE_MODE"] = "census" if mode == "census" else "trace"
            # BENCH_OPERATOR_LOG=PATH keeps the operator's log (with every handler run) for a look afterwards
            kept = os.environ.get("BENCH_OPERATOR_LOG")
            log = open(kept or root / "operator.log", "wb")  # noqa: SIM115
            verbose = ["--verbose"] if kept else []
            op = subprocess.Popen(["speculator-operator", "run", *verbose, "--namespace", "bench-operator"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            proc = psutil.Process(op.pid)
            peak, peak_at = 0, 0.0  # the operator's highest RSS seen, and when (s after the first create)
            objects = client.CustomObjectsApi(api)
            children_ready = ReadyTimes(apps.list_namespaced_deployment, deployment_ready, namespace="bench-operator")
            resources_ready = ReadyTimes(objects.list_namespaced_custom_object, resource_ready,
                                         group="speculators.dev", version="v1alpha1", namespace="bench-operator",
                                         plural="speculatordeployments")  # fmt: skip
            children_ready.start()
            resources_ready.start()
            start = stamp()
            t0 = time.monotonic()
            for i in range(n):
                objects.create_namespaced_custom_object("speculators.dev", "v1alpha1", "bench-operator",
                    "speculatordeployments", {"apiVersion": "speculators.dev/v1alpha1",
                    "kind": "SpeculatorDeployment", "metadata": {"name": f"d{i}"}, "spec": spec})  # fmt: skip
            while True:
                rss = proc.memory_info().rss
                if rss > peak:
                    peak, peak_at = rss, time.monotonic() - t0
                items = listed(objects)
                if sum(1 for it in items if (it.get("status") or {}).get("phase") == "Ready") >= n:
                    break
                if time.monotonic() - t0 > 1800:
                    raise TimeoutError("operator: not all Ready within 1800 s")
                time.sleep(0.5)
            with_operator = time.monotonic() - t0
            rss_ready = proc.memory_info().rss
            ready_at = stamp()
            causes = status_writes_by_cause(port)
            waits = lane_waits(port)
            if profile is not None:
                op.send_signal(signal.SIGUSR1)
                while not profile.exists():
                    time.sleep(0.5)
                how = env["SPECULATOR_PROFILE_MODE"]
                print(f"operator memory at all Ready ({how}):\n{profile.read_text()}")
            # a resource's first acceptance measure needs its pod ready a whole scrape interval, so under this
            # load the last ones land after all are Ready: the idle period starts once each has had its own
            t_measured = time.monotonic()
            while True:
                items = listed(objects)
                unmeasured = sum(1 for it in items if not (it.get("status") or {}).get("acceptance"))
                if unmeasured == 0 or time.monotonic() - t_measured > 300:
                    break
                peak, peak_at = max((peak, peak_at), (proc.memory_info().rss, time.monotonic() - t0))
                time.sleep(1)
            measured_after = time.monotonic() - t_measured
            # the handlers' last bookkeeping (kopf's annotations) may trail Ready: let the operator go quiet
            quiet_since = time.monotonic()
            seen = sum(writes(info.audit_log or Path(), start).values())  # type: ignore[arg-type]
            while time.monotonic() - quiet_since < 10:
                now = sum(writes(info.audit_log or Path(), start).values())  # type: ignore[arg-type]
                if now != seen:
                    seen, quiet_since = now, time.monotonic()
                time.sleep(1)
            after_ready = writes(info.audit_log or Path(), ready_at)  # type: ignore[arg-type]
            idle_start = stamp()
            causes_before_idle = status_writes_by_cause(port)
            t_idle = time.monotonic()
            while time.monotonic() - t_idle < args.idle:
                rss = proc.memory_info().rss
                if rss > peak:
                    peak, peak_at = rss, time.monotonic() - t0
                time.sleep(1)
            rss_idle = proc.memory_info().rss
            idle = writes(info.audit_log or Path(), idle_start)  # type: ignore[arg-type]
            idle_causes = {k: v - causes_before_idle.get(k, 0) for k, v in status_writes_by_cause(port).items()}
            total = writes(info.audit_log or Path(), start, ready_at)  # type: ignore[arg-type]
            op.terminate()
            op.wait(30)
            children_ready.stop.set()
            resources_ready.stop.set()
            seen = resources_ready.first
            lags = {name: seen[name] - t for name, t in children_ready.first.items() if name in seen}
            late = sorted(((round(lag, 1), name) for name, lag in lags.items() if lag > 10), reverse=True)
            print(f"{n} SpeculatorDeployments (1 replica each) on {max(2, n // 4)} fake GPU nodes")
            print(
                f"  operator: all Ready in {with_operator:.1f} s; bare client, same children: {bare:.1f} s; "
                f"ratio {with_operator / bare:.2f}"
            )
            print(
                f"  API writes by the operator until Ready: {sum(total.values())} "
                f"({sum(total.values()) / n:.1f} per resource): {dict(total)}"
            )
            print("  by purpose, per resource: " + ", ".join(f"{k} {v / n:.2f}" for k, v in kinds_of(total).items()))
            print("  status writes until Ready by cause (the operator's count), per resource: "
                  + ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(causes.items())))  # fmt: skip
            own = status_writes_before_ready(info.audit_log or Path(), start, resources_ready.at)
            print(f"  status writes before the resource's own Ready: {sum(own.values()) / n:.2f} per resource, "
                  f"max {max(own.values(), default=0)}")  # fmt: skip
            print(f"  until Ready, {waits}")
            conflicts = writes(info.audit_log or Path(), start, ready_at, refused=True)  # type: ignore[arg-type]
            print(f"  writes refused (not stored; read again and retried): {sum(conflicts.values())} {dict(conflicts)}")
            if lags:
                values = list(lags.values())
                print(
                    f"  child Deployment ready -> resource Ready (both seen by the bench's watches), {len(values)} "
                    f"resources: median {percentile(values, 0.5):.2f} s, p99 {percentile(values, 0.99):.2f} s, "
                    f"max {max(values):.2f} s" + (f"; over 10 s: {late[:5]}" if late else "")
                )
            print(f"  every resource's first acceptance measure in status {measured_after:.1f} s after all were Ready"
                  f" ({unmeasured} without one)")  # fmt: skip
            print(f"  writes after Ready until quiet: {sum(after_ready.values())} {dict(after_ready)}")
            print(f"  writes during {args.idle:.0f} s idle (resync every 60 s): {sum(idle.values())} {dict(idle)}; "
                  f"status writes by cause: {({k: v for k, v in idle_causes.items() if v})}")  # fmt: skip
            print(f"  operator peak RSS: {peak / 2**20:.0f} MiB, {peak_at:.0f} s after the first create; "
                  f"{rss_ready / 2**20:.0f} MiB when all were Ready, {rss_idle / 2**20:.0f} MiB after the idle "
                  "period")  # fmt: skip
        finally:
            if op is not None and op.poll() is None:  # an interrupted run leaves no operator behind
                op.kill()
                op.wait(30)
            local.stop()


if __name__ == "__main__":
    main()
