"""Operator failover on the local control plane (prints figures; nothing is asserted).

Two `speculator-operator run --leader-elect` processes, as the chart runs them, serve N SpeculatorDeployments.
- killed holder (SIGKILL, no handover): time until the standby holds the Lease, and until a resource
  created right after the kill is Ready (the work resumes);
- clean stop (SIGTERM, the Lease handed back, as in a rolling upgrade or a drain): the same two times.

Run: hack/bench failover   (N with BENCH_N, default 50)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.deployments import upload_pair

from speculator_harness import LocalCluster

NS = "bench-failover"


def holder(leases: client.CoordinationV1Api) -> str:
    try:
        return leases.read_namespaced_lease("speculator-operator", NS).spec.holder_identity or ""
    except client.ApiException:
        return ""


def until(check: Callable[[], bool], timeout: float = 300) -> float:
    """Seconds until check() is true (polled every 50 ms)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("not within the time allowed")
        time.sleep(0.05)
    return time.monotonic() - t0


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "50")))
    args = parser.parse_args()
    n = args.n
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: list[IO[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        local = LocalCluster(root / "cluster", args.bin_dir, gpu_nodes=max(2, n // 4), log=lambda m: None)
        info = local.start()
        try:
            os.environ.update(info.env())
            config.load_kube_config(config_file=str(info.kubeconfig))
            api = client.ApiClient()
            core, leases, objects = client.CoreV1Api(api), client.CoordinationV1Api(api), client.CustomObjectsApi(api)
            upload_pair(root)
            crds = str(Path(__file__).resolve().parents[1] / "crds")
            kubectl = [str(info.kubectl), "--kubeconfig", str(info.kubeconfig)]
            subprocess.run([*kubectl, "apply", "--server-side", "-f", crds], check=True, capture_output=True)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
            assert info.s3 is not None
            core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="s3"),
                                                              string_data=info.s3.env()))  # fmt: skip
            spec = {"verifier": {"model": "s3://bench/verifier", "credentials": {"name": "s3"}},
                    "speculator": {"source": "s3://bench/draft", "credentials": {"name": "s3"}},
                    "serving": {"replicas": 1}}  # fmt: skip

            def create(name: str) -> None:
                body = {"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment",
                        "metadata": {"name": name}, "spec": spec}  # fmt: skip
                objects.create_namespaced_custom_object("speculators.dev", "v1alpha1", NS, "speculatordeployments",
                                                        body)  # fmt: skip

            def ready(name: str) -> bool:
                obj = objects.get_namespaced_custom_object("speculators.dev", "v1alpha1", NS,
                                                           "speculatordeployments", name)  # fmt: skip
                return (obj.get("status") or {}).get("phase") == "Ready"

            def start(identity: str) -> None:
                log = open(root / f"{identity}.log", "wb")  # noqa: SIM115
                logs.append(log)
                argv = ["speculator-operator", "run", "--leader-elect", "--namespace", NS, "--lease-namespace", NS,
                        "--identity", identity]  # fmt: skip
                env = {**os.environ, "KUBECONFIG": str(info.kubeconfig)}
                procs[identity] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

            start("a")
            start("b")
            until(lambda: holder(leases) != "")
            for i in range(n):
                create(f"d{i}")
            until(lambda: all(ready(f"d{i}") for i in range(n)), timeout=900)
            print(f"{n} SpeculatorDeployments, two candidates, lease 15 s, renewal every 2 s")

            first = holder(leases)
            procs[first].kill()
            t0 = time.monotonic()
            create("after-kill")
            taken = until(lambda: holder(leases) not in ("", first))
            until(lambda: ready("after-kill"))
            resumed = time.monotonic() - t0
            print(f"  holder killed (SIGKILL): standby holds the Lease after {taken:.1f} s; "
                  f"a resource created at the kill is Ready after {resumed:.1f} s")  # fmt: skip

            second = holder(leases)
            start("c")
            until(lambda: b"standby:" in (root / "c.log").read_bytes())  # c waits as a standby
            procs[second].terminate()
            t0 = time.monotonic()
            create("after-stop")
            taken = until(lambda: holder(leases) not in ("", second))
            until(lambda: ready("after-stop"))
            resumed = time.monotonic() - t0
            procs[second].wait(60)
            print(f"  holder stopped (SIGTERM, Lease handed back): new holder after {taken:.1f} s; "
                  f"a resource created at the stop is Ready after {resumed:.1f} s")  # fmt: skip
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
            for log in logs:
                log.close()
            local.stop()


if __name__ == "__main__":
    main()
