"""The real node (prints figures; nothing is asserted).

- the local cluster with the real node: start, the images pushed to the harness's registry (what it
  lacks: after a change to the package, the changed layers only), node Ready after the kubelet started;
- the kubelet's pulls (its Pulled events: the time and the image's size as it reports them);
- a SpeculatorTrainJob on the real node (fetch, prepare-data, `train --dry-run`, audit, publish in real
  trainer pods): apply -> published, and its SpeculatorDeployment (vLLM's CPU build in a real pod):
  -> Ready -> the first completion through its Service;
- the time to restart vLLM: a serving pod deleted -> its replacement Ready.

Needs root and the images (hack/build-images); the tiny verifier is made with the speculators
environment (hack/workloads-env). Run: hack/bench node
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speculator_harness import LocalCluster
from speculator_harness.network import kube_proxy_serves

REPO = Path(__file__).resolve().parents[1]


def kubectl(info: Any, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [str(info.kubectl), "--kubeconfig", str(info.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        timeout=1200,
    )
    return out.stdout


def wait_for(what: str, check: Any, timeout: float = 1200) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic()
        time.sleep(0.25)
    raise SystemExit(f"bench: {what} not within {timeout:.0f} s")


def status(info: Any, kind: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl(info, "get", kind, name, "-o", "json")).get("status") or {})


_PULLED = re.compile(r'Successfully pulled image "([^"]+)" in ([0-9hms.µ]+).*?Image size: (\d+) bytes')


def go_seconds(duration: str) -> float:
    """A Go duration as the kubelet prints it (1m2.5s, 850ms, 3.2s) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(h|ms|µs|m|s)", duration))


def pulls(info: Any) -> list[tuple[str, float, int]]:
    """(image, seconds, bytes) of each image the kubelet pulled, from its Pulled events in every namespace."""
    events = json.loads(kubectl(info, "get", "events", "-A", "--field-selector", "reason=Pulled", "-o", "json"))
    found = []
    for event in events["items"]:
        match = _PULLED.search(event.get("message") or "")
        if match:
            found.append((match[1], go_seconds(match[2]), int(match[3])))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    args = parser.parse_args()
    workloads = (
        subprocess.run([str(REPO / "hack" / "workloads-env")], check=True, capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run(
            [f"{workloads}/bin/python", str(REPO / "hack" / "lib" / "tiny_verifier.py"), str(root / "verifier")],
            check=True,
            capture_output=True,
        )
        local = LocalCluster(root / "cluster", args.bin_dir, gpu_nodes=0, real_node=True, timeout=600)
        t0 = time.monotonic()
        info = local.start()
        up = time.monotonic() - t0
        operator = None
        try:
            d = local.durations
            print(
                f"cluster with the real node up in {up:.1f} s (images pushed in {d.get('node-images-push', 0):.1f} s; "
                f"node Ready {d.get('node-ready', 0):.1f} s after the kubelet started)"
            )
            assert info.s3 is not None
            env = {**os.environ, **info.env()}
            s3 = info.s3.client()
            s3.create_bucket(Bucket="models")
            subprocess.run(
                [sys.executable, str(REPO / "hack" / "demo-assets.py"), "--real-verifier", str(root / "verifier")],
                check=True,
                env=env,
                capture_output=True,
            )
            for crd in sorted((REPO / "crds").glob("*.yaml")):
                kubectl(info, "apply", "--server-side", "-f", str(crd))
            kubectl(info, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "models-s3", "namespace": "default"},
                "stringData": info.s3.env(),
            }
            kubectl(info, "apply", "-f", "-", stdin=json.dumps(secret))
            ws = root / "ws"
            ws.mkdir()
            ws.chmod(0o777)
            volume = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "bench-ws"},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "hostPath": {"path": str(ws)},
                    "claimRef": {"namespace": "default", "name": "tiny-cpu-ws"},
                },
            }
            claim = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "tiny-cpu-ws", "namespace": "default"},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
            kubectl(info, "apply", "-f", "-", stdin=json.dumps(volume) + "\n---\n" + json.dumps(claim))
            log = (root / "operator.log").open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "speculator_operator.cli", "run", "--standalone", "--all-namespaces"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            t_apply = time.monotonic()
            kubectl(info, "apply", "-f", str(REPO / "examples" / "cpu-node.yaml"))
            t_published = wait_for("the train job", lambda: status(info, "stj", "tiny-cpu").get("phase") == "Succeeded")
            t_ready = wait_for("the deployment", lambda: status(info, "sdep", "tiny-cpu").get("phase") == "Ready")
            ip = json.loads(kubectl(info, "get", "service", "tiny-cpu", "-o", "json"))["spec"]["clusterIP"]
            wait_for("kube-proxy", lambda: kube_proxy_serves(ip), timeout=60)
            body = json.dumps({"model": "tiny-cpu", "prompt": "the verifier", "max_tokens": 16}).encode()
            req = urllib.request.Request(
                f"http://{ip}:8000/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - a Service of our own node
                json.loads(resp.read())
            t_answer = time.monotonic()
            print(f"train job on the real node: apply -> published {t_published - t_apply:.1f} s")
            print(
                f"its deployment (vLLM CPU, real pod): -> Ready {t_ready - t_apply:.1f} s after the job's apply, "
                f"{t_ready - t_published:.1f} s after the publish; -> first completion {t_answer - t_ready:.1f} s later"
            )
            for image, seconds, size in pulls(info):
                print(f"pulled {image}: {seconds:.1f} s, {size / 2**20:.0f} MiB (the kubelet's Pulled event)")
            pods = json.loads(kubectl(info, "get", "pods", "-l", "speculators.dev/deployment=tiny-cpu", "-o", "json"))
            old = pods["items"][0]["metadata"]["name"]
            t_kill = time.monotonic()
            kubectl(info, "delete", "pod", old, "--wait=false")

            def replaced() -> bool:
                items = json.loads(
                    kubectl(info, "get", "pods", "-l", "speculators.dev/deployment=tiny-cpu", "-o", "json")
                )["items"]
                return any(
                    p["metadata"]["name"] != old
                    and any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in p["status"].get("conditions", [])
                    )
                    for p in items
                )

            t_back = wait_for("the replacement pod", replaced)
            print(
                f"a serving pod deleted -> its replacement Ready (stage + audit + vLLM start) {t_back - t_kill:.1f} s"
            )
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(30)
            local.stop()


if __name__ == "__main__":
    main()
