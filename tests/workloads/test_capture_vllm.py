"""The capture in the real pinned vLLM (its CPU build), loaded as the serving pods load it (`--middleware`, with
--per-request-spec-decode-metrics and a speculators dry-run EAGLE-3 draft), and its shards through the real
`speculators prepare-data`: bounded traffic, streaming and not, makes the rows prepare-data keeps (targets only the
served completions), each with the request's acceptance; at temperature 0 the clients get the same choices and
usage with the capture on as off, and no added field; redaction holds before the bytes reach storage; storage
that cannot be written costs no response and moves the dropped counter; no captured text reaches a log."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from speculator_operator.api import podcontract

from ..waiting import eventually
from .conftest import REPO
from .test_vllm_cpu import Server, base_args, post

pytestmark = pytest.mark.workloads

MARKER = "capture-marker-31337"  # in every prompt: it must reach no log
SECRET = "REDACT-ME-4242"  # a redaction matches it: it must reach no shard
K = 3
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(i: int, **more: Any) -> dict[str, Any]:
    return {"model": "tiny-verifier", "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": f"{MARKER} question {i}"},
                         {"role": "assistant", "content": f"an earlier answer {i}"},
                         {"role": "user", "content": f"and then {i}?"}], **more}  # fmt: skip


def completion(i: int, **more: Any) -> dict[str, Any]:
    return {"model": "tiny-verifier", "temperature": 0, "max_tokens": 12, "prompt": f"{MARKER} the draft {i}", **more}


# the traffic: (route, body), the same for the server with the capture and without
CAPTURED = [
    *[(CHAT, chat(i)) for i in range(3)],
    *[(CHAT, chat(i, stream=True)) for i in range(3, 5)],
    (CHAT, chat(5, stream=True, stream_options={"include_usage": True})),  # the client's own usage chunk stays
    *[(COMPLETIONS, completion(i)) for i in range(2)],
    *[(COMPLETIONS, completion(i, stream=True)) for i in range(2, 4)],
]
SKIPPED = [
    (CHAT, chat(9, messages=[{"role": "user", "content": f"{MARKER} {SECRET}"}])),  # redacted
    (COMPLETIONS, completion(9, echo=True)),  # echo
]


def send(server: Server, route: str, body: dict[str, Any]) -> Any:
    """The answer (a stream as its events' JSON, the comments and [DONE] left out), ids and times aside."""
    if not body.get("stream"):
        return scrub(post(server.url(route), body))
    req = urllib.request.Request(server.url(route), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as resp:
        text = resp.read().decode()
    return [scrub(json.loads(e[len("data: ") :])) for e in text.split("\n\n") if e.startswith("data: {")]


def scrub(answer: Any) -> Any:
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


def metric(server: Server, name: str, **labels: str) -> float:
    with urllib.request.urlopen(server.url("/metrics"), timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def start(
    vllm_env: Path, pair: dict[str, Path], log: Path, capture: Path | None, monkeypatch: pytest.MonkeyPatch
) -> Server:
    spec = {"method": "eagle3", "model": str(pair["eagle3"]), "num_speculative_tokens": K}
    args = [*base_args(pair["verifier"]), "--speculative-config", json.dumps(spec)]
    if capture is not None:
        args += ["--per-request-spec-decode-metrics", "summary", "--middleware", podcontract.CAPTURE_MIDDLEWARE]
        # the server image installs this package next to vLLM; here it is the working tree's
        monkeypatch.setenv("PYTHONPATH", str(REPO / "operator"))
        monkeypatch.setenv(podcontract.CAPTURE_CONFIG_ENV, str(capture))
        monkeypatch.setenv(podcontract.CAPTURE_POD_ENV, "qwen-capture-0")
    server = Server(vllm_env, args, log)
    server.wait_healthy()
    return server


def settings(path: Path, mount: Path) -> None:
    body = podcontract.CaptureSettings(
        fraction=1.0, max_per_hour=1000, location="pvc://captures/live", pvc_mount=str(mount), namespace="team",
        deployment="qwen", served_model="tiny-verifier", served_revision="r-1", verifier_revision="v-1",
        draft_revision="d-1", k=K, redact=[podcontract.CaptureRedaction(pattern=r"REDACT-ME-\d+")], shard_rows=1,
    )  # fmt: skip
    temporary = path.with_name(path.name + ".new")  # renamed over the old file, as the kubelet updates a ConfigMap
    temporary.write_text(body.model_dump_json(by_alias=True))
    temporary.replace(path)


def shards(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(root.rglob("*.jsonl")) for line in f.read_text().splitlines()]


def test_the_capture_in_vllm_makes_rows_prepare_data_trains_on(
    vllm_env: Path, workloads_env: Path, dry_run_checkpoints: dict[str, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    off_log, on_log = tmp_path / "vllm-off.log", tmp_path / "vllm-on.log"
    server = start(vllm_env, dry_run_checkpoints, off_log, None, monkeypatch)
    try:
        without = [send(server, route, body) for route, body in CAPTURED]
    finally:
        server.stop()

    mount, config = tmp_path / "claim", tmp_path / "capture.json"
    settings(config, mount)
    server = start(vllm_env, dry_run_checkpoints, on_log, config, monkeypatch)
    try:
        with_capture = [send(server, route, body) for route, body in CAPTURED]
        for route, body in SKIPPED:
            send(server, route, body)
        # the same choices and usage, the same fields: nothing added, nothing missing
        assert with_capture == without

        root = mount / "live" / "team" / "qwen" / "v-1" / "d-1"
        eventually(lambda: _rows(root, len(CAPTURED)), timeout=60)
        assert metric(server, podcontract.CAPTURE_REQUESTS_METRIC, outcome="captured") == len(CAPTURED)
        assert metric(server, podcontract.CAPTURE_SKIPPED_METRIC, reason="redacted") == 1
        assert metric(server, podcontract.CAPTURE_SKIPPED_METRIC, reason="echo") == 1
        assert metric(server, podcontract.CAPTURE_BYTES_METRIC) == sum(f.stat().st_size for f in root.glob("*.jsonl"))

        rows = shards(root)
        for row, (_, body), answer in zip(rows, CAPTURED, with_capture, strict=True):
            prompt, completed = row["loss_mask"].count(0), row["loss_mask"].count(1)
            assert row["loss_mask"] == [0] * prompt + [1] * completed  # the earlier assistant turn is context
            assert len(row["input_ids"]) == prompt + completed
            usage = answer.get("usage") if isinstance(answer, dict) else next(
                (a["usage"] for a in answer if a.get("usage")), None)  # fmt: skip
            if usage is not None:  # the served completion, and only it, is the target
                assert (prompt, completed) == (usage["prompt_tokens"], usage["completion_tokens"])
            if isinstance(answer, list):  # a stream: the row holds the text its events carried
                said = "".join(c["delta"].get("content") or "" if "delta" in c else c.get("text") or ""
                               for a in answer for c in a["choices"])  # fmt: skip
                held = json.loads(row["completion"])
                assert (held.get("content") or held.get("text") or "") == said
            assert row["acceptance"]["num_spec_tokens"] == K
            assert json.loads(row["sampling"])["temperature"] == 0
            assert bool(json.loads(row["sampling"]).get("stream")) == bool(body.get("stream"))
        assert SECRET.encode() not in b"".join(f.read_bytes() for f in root.rglob("*"))  # redacted before storage

        # storage that cannot be written (the claim's mount is a file): every response still served, counted
        blocked = tmp_path / "not-a-folder"
        blocked.write_text("")
        settings(config, blocked)
        dropped = metric(server, podcontract.CAPTURE_REQUESTS_METRIC, outcome="dropped")

        def served_and_dropped() -> None:  # the settings apply within the capture's check interval
            route, body = CAPTURED[0]
            assert send(server, route, body)["choices"]
            assert metric(server, podcontract.CAPTURE_REQUESTS_METRIC, outcome="dropped") > dropped
            assert metric(server, podcontract.CAPTURE_ERRORS_METRIC, kind="storage") >= 1

        eventually(served_and_dropped, timeout=60, interval=1)
    finally:
        server.stop()
    for log in (off_log, on_log):
        assert MARKER not in log.read_text(errors="replace")

    # the real prepare-data reads the shards as pretokenized rows: every one kept, targets only the completions
    prepared = tmp_path / "prepared"
    subprocess.run([str(workloads_env / "bin" / "speculators"), "prepare-data", "--model",
                    str(dry_run_checkpoints["verifier"]), "--data", str(mount / "live"), "--output", str(prepared),
                    "--seq-length", "512"], check=True, capture_output=True, timeout=600,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})  # fmt: skip
    check = ("import json, sys\nfrom datasets import load_from_disk\nds = load_from_disk(sys.argv[1])\n"
             "rows = [[list(map(int, r['input_ids'])), list(map(int, r['loss_mask']))] for r in ds]\n"
             "print(json.dumps(rows))")  # fmt: skip
    out = subprocess.run([str(workloads_env / "bin" / "python"), "-c", check, str(prepared)], check=True,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    kept = sorted(json.loads(out.stdout.strip().splitlines()[-1]))
    assert kept == sorted([r["input_ids"], r["loss_mask"]] for r in shards(root))  # a request or two more may have
    # been captured there before the unwritable settings applied


def _rows(root: Path, n: int) -> None:
    assert len(shards(root)) == n
