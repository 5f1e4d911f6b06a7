"""Live acceptance on the real control plane, with scripted vLLM metrics: the serving pods run on a kwok node
whose pod range lies in 127.0.0.0/8, and a stand-in on this machine answers each pod's address with
vLLM-shaped counters that grow on every scrape as the test scripts them (agreeing, disagreeing, broken).
Real vLLM's own numbers are checked on the real node (test_node.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kopf.testing import KopfRunner
from kubernetes import client
from prometheus_client import REGISTRY

from speculator_operator.localcluster.kwok import node as fake_node

from .conftest import Cluster, eventually, get, sdep

pytestmark = pytest.mark.cluster

NODE = "kwok-standin-0"
POD_CIDR = "127.1.0.0/24"
PORT = 8000
STEP = 100  # drafts per scrape


class StandIn:
    """vLLM's /metrics at one pod's address: every scrape advances the counters by STEP drafts of K tokens,
    all accepted (agree) or none (disagree); the other modes answer the way a broken pod would."""

    def __init__(self, ip: str, k: int) -> None:
        self.k = k
        self.mode = "agree"
        self.drafts = self.accepted = 0
        self.positions = [0] * k
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
        return "\n".join(rows) + "\n"

    def answer(self, req: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        if mode in ("agree", "disagree", "backwards"):
            if mode == "backwards":  # a restarted vLLM: its counters start again from zero
                self.drafts = self.accepted = 0
                self.positions = [0] * self.k
                self.mode = "agree"
            self.drafts += STEP
            if mode != "disagree":
                self.accepted += STEP * self.k
                self.positions = [v + STEP for v in self.positions]
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


def _serving(min_samples: int = 100) -> dict[str, Any]:
    return {
        "nodeSelector": {"speculators.dev/standin": "true"},
        "tuning": {"minSamples": min_samples, "windowSeconds": 30},
    }


def _stand_ins(cluster: Cluster, namespace: str, name: str, k: int, replicas: int) -> dict[str, StandIn]:
    def ready_pods() -> list[dict[str, Any]]:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"speculators.dev/deployment={name}", "-o", "json")
        pods = [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]
        ips = [p["status"].get("podIP", "") for p in pods]
        assert len(pods) == replicas, [p["metadata"]["name"] for p in pods]
        assert all(ip.startswith("127.1.0.") for ip in ips), ips  # never a kwok address off this machine
        return pods

    pods = eventually(ready_pods, timeout=60)
    return {p["metadata"]["name"]: StandIn(p["status"]["podIP"], k) for p in pods}


def _effective(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    conditions = get(cluster, namespace, f"sdep/{name}")["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "SpeculationEffective"), {})


def _warnings(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    events = get(cluster, namespace, "events")["items"]
    return [e for e in events if e.get("reason") == reason and e.get("type") == "Warning"]


def test_acceptance_reaches_status_and_speculation_effective_flips_once(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, standin_node: str
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=sdep("flip", store, "good", creds, replicas=1, **_serving())
    )
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/flip", "--timeout=120s")
    status = get(cluster, namespace, "sdep/flip")["status"]
    k = status["numSpeculativeTokens"]
    assert status["economics"]["costRatio"] > 0  # the pair is priced: the verifier's config was read
    stand_ins = _stand_ins(cluster, namespace, "flip", k, 1)
    try:
        # a draft the verifier always agrees with
        def effective() -> dict[str, Any]:
            cond = _effective(cluster, namespace, "flip")
            assert (cond.get("status"), cond.get("reason")) == ("True", "AboveBreakEven"), cond
            return cond

        eventually(effective, timeout=60)
        acc = get(cluster, namespace, "sdep/flip")["status"]["acceptance"]
        assert acc["rate"] == 1.0
        assert acc["alpha"] == 1.0
        assert acc["meanAcceptedLength"] == k + 1
        assert acc["perPosition"] == [1.0] * k
        assert acc["percent"] == "100.0%"
        assert acc["revision"] == status["revision"]
        assert acc["recommendedK"] == status["economics"]["maxK"]
        assert acc["predictedSpeedup"] > 1
        assert acc["load"]["requestsRunning"] == 3.0
        labels = {"namespace": namespace, "name": "flip"}
        assert REGISTRY.get_sample_value("speculator_acceptance_rate", labels) == 1.0  # the operator's own metrics
        printed = cluster.kubectl("get", "-n", namespace, "speculators").stdout
        assert "100.0%" in printed  # the printer column

        # the draft stops agreeing: once the window has drained, speculation is judged not to pay
        for s in stand_ins.values():
            s.mode = "disagree"

        def below() -> dict[str, Any]:
            cond = _effective(cluster, namespace, "flip")
            assert (cond.get("status"), cond.get("reason")) == ("False", "BelowBreakEven"), cond
            return cond

        cond = eventually(below, timeout=120)
        assert "break-even α*" in cond["message"]
        acc = get(cluster, namespace, "sdep/flip")["status"]["acceptance"]
        assert acc["predictedSpeedup"] < 1
        assert acc["alpha"] < acc["breakEvenAlpha"]

        # and once nothing agreeing is left in the window, the best K is none at all
        def none_accepted() -> None:
            acc = get(cluster, namespace, "sdep/flip")["status"]["acceptance"]
            assert (acc["rate"], acc["recommendedK"]) == (0.0, 0), acc

        eventually(none_accepted, timeout=60)
        eventually(lambda: _assert_len(_warnings(cluster, namespace, "BelowBreakEven"), 1), timeout=30)
        # it stays False for five more scrapes: no second event (one per transition)
        scraped = stand_ins[next(iter(stand_ins))]
        seen = scraped.drafts
        eventually(lambda: _assert(scraped.drafts >= seen + 5 * STEP, "fewer than 5 more scrapes"), timeout=30)
        assert _effective(cluster, namespace, "flip")["status"] == "False"
        warnings = _warnings(cluster, namespace, "BelowBreakEven")
        assert len(warnings) == 1
        assert warnings[0].get("count", 1) == 1
    finally:
        for s in stand_ins.values():
            s.close()


def _assert_len(items: list[Any], n: int) -> None:
    assert len(items) == n, items


def _assert(condition: bool, message: str) -> None:
    assert condition, message


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("garbage", "Unparseable"), ("error", "HTTPError"), ("slow", "Timeout"), ("huge", "TooLarge")],
)
def test_a_broken_pod_is_named_and_the_others_still_count(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    standin_node: str,
    mode: str,
    reason: str,
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("pair", store, "good", creds, **_serving()))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/pair", "--timeout=120s")
    k = get(cluster, namespace, "sdep/pair")["status"]["numSpeculativeTokens"]
    stand_ins = _stand_ins(cluster, namespace, "pair", k, 2)
    bad = sorted(stand_ins)[1]
    try:
        eventually(lambda: _assert_counted(cluster, namespace, 2, None), timeout=60)
        stand_ins[bad].mode = mode
        acc = eventually(lambda: _assert_counted(cluster, namespace, 1, (bad, reason)), timeout=60)
        assert acc["drafts"] > 0  # the good pod's drafts still count
        assert acc["rate"] == 1.0
        # bounded: the scrapes go on at their pace (observedAt moves with the good pod's numbers)
        stand_ins[bad].mode = "agree"
        eventually(lambda: _assert_counted(cluster, namespace, 2, None), timeout=60)
    finally:
        for s in stand_ins.values():
            s.close()


def _assert_counted(cluster: Cluster, namespace: str, counted: int, failing: tuple[str, str] | None) -> dict[str, Any]:
    acc = get(cluster, namespace, "sdep/pair")["status"].get("acceptance") or {}
    pods = acc.get("pods") or {}
    assert pods.get("counted") == counted, acc
    listed = [(f["pod"], f["reason"]) for f in pods.get("failing") or []]
    out = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide")
    assert listed == ([failing] if failing else []), (acc, out.stdout)
    return acc


def test_a_restarted_vllm_resets_its_counters_and_is_still_counted(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, standin_node: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("pair", store, "good", creds, **_serving()))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/pair", "--timeout=120s")
    k = get(cluster, namespace, "sdep/pair")["status"]["numSpeculativeTokens"]
    stand_ins = _stand_ins(cluster, namespace, "pair", k, 2)
    try:
        eventually(lambda: _assert_counted(cluster, namespace, 2, None), timeout=60)
        first = sorted(stand_ins)[0]
        # well past its first reading: a restart must bring the counter below what the operator last saw
        eventually(lambda: _assert(stand_ins[first].drafts >= 5 * STEP, "fewer than 5 scrapes so far"), timeout=30)
        stand_ins[first].mode = "backwards"

        def reset_seen() -> dict[str, Any]:
            acc = _assert_counted(cluster, namespace, 2, None)
            assert (acc["pods"].get("counterResets") or 0) >= 1, acc
            return acc

        acc = eventually(reset_seen, timeout=60)
        assert acc["rate"] == 1.0  # the reset is not read as negative acceptance
    finally:
        for s in stand_ins.values():
            s.close()
