"""Scripted vLLM metrics for the cluster tests: a kwok GPU node whose pod range lies in 127.0.0.0/8, and a
stand-in on this machine that answers each pod's address with vLLM-shaped counters that grow on every
scrape as a test scripts them (agreeing, disagreeing, at a given per-position acceptance α, broken). A kwok
pod address outside loopback is never dialled."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from speculator_harness.kwok import node as fake_node

from .conftest import Cluster, eventually

NODE = "kwok-standin-0"
POD_CIDR = "127.1.0.0/24"
PORT = 8000
STEP = 100  # drafts per scrape


class StandIn:
    """vLLM's /metrics at one pod's address: every scrape advances the counters by `step` drafts of K tokens,
    all accepted (agree), none (disagree), or position p accepted in a fraction α^(p+1) of them (alpha:
    the economics model's per-position acceptance); the other modes answer the way a broken pod would."""

    def __init__(self, ip: str, k: int) -> None:
        self.k = k
        self.mode = "agree"
        self.step = STEP
        self.alpha = 1.0
        self.scrapes = 0  # answers given in the counting modes
        self.drafts = self.accepted = 0.0
        self.positions = [0.0] * k
        self.step_ms: float | None = None  # set: vLLM's step-time series too (every drafting request-step this long)
        self.batch = 2.0  # decoding requests per engine step, with step_ms
        self.itl_sum = self.itl_count = self.steps = 0.0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                stand_in.answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((ip, PORT), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def text(self) -> str:
        rows = []
        for name, value in (
            ("vllm:spec_decode_num_drafts", self.drafts),
            ("vllm:spec_decode_num_draft_tokens", self.drafts * self.k),
            ("vllm:spec_decode_num_accepted_tokens", self.accepted),
        ):
            rows += [
                f"# HELP {name}_total stand-in",
                f"# TYPE {name}_total counter",
                f'{name}_total{{engine="0",model_name="m"}} {float(value)}',
                f'{name}_created{{engine="0",model_name="m"}} 1.7e+09',
            ]
        name = "vllm:spec_decode_num_accepted_tokens_per_pos"
        rows += [f"# HELP {name}_total stand-in", f"# TYPE {name}_total counter"]
        rows += [
            f'{name}_total{{engine="0",model_name="m",position="{p}"}} {float(v)}' for p, v in enumerate(self.positions)
        ]
        rows += ["# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0",model_name="m"} 3.0']
        if self.step_ms is not None:
            for name, count, total in (
                ("vllm:inter_token_latency_seconds", self.itl_count, self.itl_sum),
                ("vllm:iteration_tokens_total", self.steps, self.steps * self.batch),
            ):
                rows += [
                    f"# TYPE {name} histogram",
                    f'{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {float(count)}',
                    f'{name}_count{{engine="0",model_name="m"}} {float(count)}',
                    f'{name}_sum{{engine="0",model_name="m"}} {float(total)}',
                ]
        return "\n".join(rows) + "\n"

    def answer(self, req: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        if mode in ("agree", "disagree", "backwards", "alpha"):
            if mode == "backwards":  # a restarted vLLM: its counters start again from zero
                self.drafts = self.accepted = 0.0
                self.positions = [0.0] * self.k
                self.mode = "agree"
            step = self.step
            self.scrapes += 1
            self.drafts += step
            alpha = {"disagree": 0.0, "alpha": self.alpha}.get(mode, 1.0)
            accepted = [step * alpha ** (p + 1) for p in range(self.k)]
            self.accepted += sum(accepted)
            self.positions = [v + a for v, a in zip(self.positions, accepted, strict=True)]
            if self.step_ms is not None:  # one request-step per draft, `batch` of them per engine step
                self.itl_count += step
                self.itl_sum += step * self.step_ms / 1000
                self.steps += step / self.batch
            body = self.text().encode()
        elif mode == "garbage":
            body = b"<html><body>502 Bad Gateway</body></html>"
        elif mode == "error":
            req.send_response(500)
            req.end_headers()
            return
        elif mode == "slow":
            time.sleep(4)  # past the operator's scrape timeout (1 s in these tests)
            body = self.text().encode()
        elif mode == "huge":
            req.send_response(200)
            req.send_header("Content-Type", "text/plain")
            req.end_headers()
            chunk = b"# padding " + b"x" * 65_000 + b"\n"
            try:
                for _ in range(64):  # 4 MiB, past the 2 MiB the operator reads
                    req.wfile.write(chunk)
            except OSError:
                pass  # the operator hung up once it had read enough
            return
        else:
            raise AssertionError(mode)
        req.send_response(200)
        req.send_header("Content-Type", "text/plain; version=0.0.4")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)


@pytest.fixture(scope="module")
def standin_node(cluster: Cluster) -> Iterator[str]:
    """A kwok GPU node whose pods get addresses in 127.1.0.0/24 (kwok takes a node's podCIDR)."""
    body = fake_node(NODE, 8, "NVIDIA-H100-80GB-HBM3")
    body["metadata"]["labels"]["speculators.dev/standin"] = "true"
    body["spec"]["podCIDR"] = POD_CIDR
    body["spec"]["podCIDRs"] = [POD_CIDR]
    core = client.CoreV1Api(cluster.api)
    core.create_node(body)
    cluster.kubectl("wait", "--for=condition=Ready", f"node/{NODE}", "--timeout=60s")
    yield NODE
    core.delete_node(NODE)


def serving(min_samples: int = 100) -> dict[str, Any]:
    return {
        "nodeSelector": {"speculators.dev/standin": "true"},
        "tuning": {"minSamples": min_samples, "windowSeconds": 30},
    }


def stand_ins(cluster: Cluster, namespace: str, name: str, k: int, replicas: int) -> dict[str, StandIn]:
    def ready_pods() -> list[dict[str, Any]]:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"speculators.dev/deployment={name}", "-o", "json")
        pods = [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]
        ips = [p["status"].get("podIP", "") for p in pods]
        assert len(pods) == replicas, [p["metadata"]["name"] for p in pods]
        assert all(ip.startswith("127.1.0.") for ip in ips), ips  # never a kwok address off this machine
        return pods

    pods = eventually(ready_pods, timeout=60)
    return {p["metadata"]["name"]: StandIn(p["status"]["podIP"], k) for p in pods}
