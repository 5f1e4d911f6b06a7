"""The capture in the serving pod (pods/capture/) against a stand-in for vLLM 0.32's server (tests/unit/vllm_asgi.py):
the client's bytes with the capture on are the ones it gets with the capture off, sampled or not, streaming or
not; a captured row is the exact tokens with their loss mask; what is not on-policy is skipped and counted; the
spool never makes a response wait; settings are picked up live and fail closed; nothing captured reaches a log."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from speculator_operator.api import podcontract
from speculator_operator.api.podcontract import CaptureSettings
from speculator_operator.pods.capture import policy, wire
from speculator_operator.pods.capture.config import LiveSettings
from speculator_operator.pods.capture.middleware import Capture
from speculator_operator.pods.capture.spool import PvcWriter, S3Writer, ShardKey, Spool, shard_name

from ..waiting import eventually
from .vllm_asgi import COMPLETION, SERVED, VllmAsgi, prompt_ids

MARKER = "zebra-7f3a-unique-marker"
CHAT = {"model": SERVED, "messages": [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "say hello"},
                                      {"role": "assistant", "content": "earlier turn"},
                                      {"role": "user", "content": "again please"}],
        "temperature": 0.7, "max_tokens": 16}  # fmt: skip
COMPLETIONS = {"model": SERVED, "prompt": "the draft predicts", "temperature": 0, "max_tokens": 16}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


# ---- the rig: an ASGI client, a settings file, a spool writing to memory ---------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def call(app: Any, path: str, body: dict[str, Any] | bytes, *, split: bool = False) -> Reply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def run() -> list[dict[str, Any]]:
        parts = [raw[: len(raw) // 2], raw[len(raw) // 2 :]] if split else [raw]
        incoming = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if incoming:
                return incoming.pop(0)
            await asyncio.Event().wait()  # the client stays
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            sent.append(dict(message))

        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                   (b"authorization", f"Bearer {MARKER}".encode())]  # fmt: skip
        scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}
        await app(scope, receive, send)
        return sent

    sent = asyncio.run(run())
    start = sent[0]
    assert start["type"] == "http.response.start"
    body_out = b"".join(m.get("body", b"") for m in sent[1:])
    assert not sent[-1].get("more_body", False)
    return Reply(start["status"], {bytes(k): bytes(v) for k, v in start["headers"]}, body_out)


class Memory:
    """Shards written to a dict (a writer that can be blocked, or made to fail)."""

    def __init__(self) -> None:
        self.shards: dict[str, bytes] = {}
        self.gate: threading.Event | None = None
        self.failure: Exception | None = None
        self.entered = threading.Event()

    def write(self, key: str, body: bytes) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if self.failure is not None:
            raise self.failure
        self.shards[key] = body


def settings_file(path: Path, **over: Any) -> Path:
    base = {"fraction": 1.0, "maxPerHour": 1000, "location": "s3://captures/live", "namespace": "team",
            "deployment": "qwen", "servedModel": SERVED, "servedRevision": "r-1", "verifierRevision": "v-abc",
            "draftRevision": "d-123", "k": 3}  # fmt: skip
    # a new file renamed over the old one, as the kubelet updates a ConfigMap's files
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(json.dumps({**base, **over}))
    temporary.replace(path)
    return path


class Rig:
    def __init__(self, tmp_path: Path, **spool: Any) -> None:
        self.path = settings_file(tmp_path / "capture.json")
        self.memory = Memory()
        self.spool = Spool(writers=lambda key: (self.memory, "live"), pod="pod-0", shard_seconds=3600,
                           backoff=(0.01, 0.01), **spool)  # fmt: skip
        self.now = 1_800_000_000.0
        self.settings = LiveSettings(str(self.path), check_seconds=0)

    def set(self, **over: Any) -> None:
        settings_file(self.path, **over)

    def capture(self, app: Any, draw: float = 0.0) -> Capture:
        return Capture(app, settings=self.settings, spool=self.spool, draw=lambda: draw, clock=lambda: self.now)

    def rows(self) -> list[dict[str, Any]]:
        assert self.spool.flush()
        return [json.loads(line) for body in self.memory.shards.values() for line in body.splitlines()]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    if made.memory.gate is not None:
        made.memory.gate.set()
    made.spool.close(5)


def count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def skipped(reason: str) -> float:
    return count(podcontract.CAPTURE_SKIPPED_METRIC, reason=reason)


def outcome(name: str) -> float:
    return count(podcontract.CAPTURE_REQUESTS_METRIC, outcome=name)


def request(kind: str, stream: bool, **over: Any) -> dict[str, Any]:
    body = {**(CHAT if kind == "chat" else COMPLETIONS), **over}
    return {**body, "stream": True} if stream else body


# ---- what the client gets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["whole-events", "split-events"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("sampled", [False, True], ids=["unsampled", "sampled"])
def test_the_client_gets_the_bytes_it_gets_without_the_capture(
    rig: Rig, kind: str, stream: bool, split: bool, sampled: bool
) -> None:
    rig.set(fraction=0.5)
    for usage in [False, True] if stream else [False]:
        body = request(kind, stream, **({"stream_options": {"include_usage": True}} if usage else {}))
        off = call(VllmAsgi(spec_metrics=False, split=split), PATHS[kind], body)
        server = VllmAsgi(spec_metrics=True, split=split)
        on = call(rig.capture(server, draw=0.0 if sampled else 0.99), PATHS[kind], body, split=split)
        assert (on.status, on.body) == (off.status, off.body)
        assert on.headers == off.headers  # Content-Length included
        asked = server.received[-1]
        assert asked.get("return_token_ids", False) is sampled
        if stream:
            assert asked.get("stream_options", {}).get("include_usage", False) is (sampled or usage)
    assert len(rig.rows()) == (2 if stream else 1) * sampled


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_timing_metrics_the_user_asked_for_stay(rig: Rig, stream: bool) -> None:
    rig.set(timingMetrics=True)
    body = request("chat", stream, stream_options={"include_usage": True}) if stream else request("chat", False)
    off = call(VllmAsgi(spec_metrics=False, timing=True), PATHS["chat"], body)
    for draw in (0.0, 0.99):
        on = call(rig.capture(VllmAsgi(spec_metrics=True, timing=True), draw=draw), PATHS["chat"], body)
        assert on.body == off.body
        assert b"time_to_first_token_ms" in on.body
        assert b'"speculative_decoding":{' not in on.body


def test_the_users_own_per_request_metrics_and_token_ids_stay(rig: Rig) -> None:
    rig.set(keepMetrics=True, fraction=0.5)
    body = request("completion", False, return_token_ids=True)
    direct = call(VllmAsgi(spec_metrics=True), PATHS["completion"], body)
    for draw in (0.0, 0.99):
        on = call(rig.capture(VllmAsgi(spec_metrics=True), draw=draw), PATHS["completion"], body)
        assert on.body == direct.body
        assert b'"draft_acceptance_rate"' in on.body
        assert b'"token_ids":[101' in on.body
    assert len(rig.rows()) == 1


# ---- the row -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_row_is_the_exact_tokens_the_prompt_as_context_and_the_completion_as_target(
    rig: Rig, kind: str, stream: bool
) -> None:
    body = request(kind, stream, seed=3, tools=[{"type": "function", "function": {"name": "f"}}])
    call(rig.capture(VllmAsgi(split=True)), PATHS[kind], body)
    (row,) = rig.rows()
    prompt = prompt_ids(body)
    completion = [t for t, _ in COMPLETION]
    assert row["input_ids"] == prompt + completion
    assert row["loss_mask"] == [0] * len(prompt) + [1] * len(completion)  # the earlier assistant turn is context
    assert row["schemaVersion"] == podcontract.CAPTURE_SHARD_VERSION
    assert row["kind"] == kind
    text = "".join(t for _, t in COMPLETION)
    if kind == "chat":
        assert json.loads(row["messages"]) == body["messages"]
        assert json.loads(row["prompt"]) is None
        assert json.loads(row["completion"])["content"] == text
    else:
        assert json.loads(row["prompt"]) == body["prompt"]
        assert json.loads(row["completion"]) == {"text": text}
    assert json.loads(row["tools"]) == body["tools"]
    assert json.loads(row["sampling"]) == {"temperature": body["temperature"], "max_tokens": 16, "seed": 3,
                                           **({"stream": True} if stream else {})}  # fmt: skip
    assert row["acceptance"]["draft_acceptance_rate"] == pytest.approx(0.3)
    assert row["acceptance"]["num_spec_tokens"] == 3
    assert (row["servedRevision"], row["verifierRevision"], row["draftRevision"], row["k"]) == (
        "r-1",
        "v-abc",
        "d-123",
        3,
    )
    assert row["finishReason"] == "stop"
    assert row["capturedAt"] == "2027-01-15T08:00:00Z"
    (key,) = rig.memory.shards
    assert re.fullmatch(r"live/team/qwen/v-abc/d-123/20\d{6}T\d{6}Z-pod-0-\d+-000000\.jsonl", key)


def test_every_row_has_the_same_columns_and_types(rig: Rig) -> None:
    """datasets loads the shards of a learning run side by side only when their columns agree."""
    for kind in ("chat", "completion"):
        for stream in (False, True):
            call(rig.capture(VllmAsgi()), PATHS[kind], request(kind, stream))
    rows = rig.rows()
    assert len(rows) == 4
    shapes = {tuple((k, type(v).__name__) for k, v in row.items()) for row in rows}
    assert len(shapes) == 1


# ---- what is skipped ---------------------------------------------------------------------------------------------

SKIPS: list[tuple[str, str, dict[str, Any] | bytes]] = [
    ("beam-search", "chat", {"use_beam_search": True}),
    ("n", "chat", {"n": 2}),
    ("echo", "completion", {"echo": True}),
    ("prefill", "chat", {"continue_final_message": True, "add_generation_prompt": False}),
    ("prefill", "chat", {"add_generation_prompt": False}),
    ("watermark", "chat", {"watermarking": True}),
    ("input", "chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ("input", "completion", {"prompt_embeds": "AAAA"}),
    ("batch", "completion", {"prompt": ["one", "two"]}),
    ("adapter", "chat", {"model": "support-lora"}),
    ("status", "chat", {"min_p": 0.1}),
    ("threshold", "chat", {"seed": 8}),
    ("body", "chat", b"{not json"),
]


@pytest.mark.parametrize(("reason", "kind", "change"), SKIPS, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(SKIPS)])
def test_what_is_not_on_policy_is_skipped_and_counted(
    rig: Rig, reason: str, kind: str, change: dict[str, Any] | bytes
) -> None:
    rig.set(mode="BelowThreshold", threshold=0.5)
    body = change if isinstance(change, bytes) else request(kind, False, **change)
    before = skipped(reason), outcome("skipped")
    off = call(VllmAsgi(spec_metrics=False), PATHS[kind], body)
    on = call(rig.capture(VllmAsgi()), PATHS[kind], body)
    assert (on.status, on.body) == (off.status, off.body)
    assert (skipped(reason), outcome("skipped")) == (before[0] + 1, before[1] + 1)
    assert rig.rows() == []


def test_other_generating_routes_are_skipped_as_path(rig: Rig) -> None:
    before = skipped("path")
    call(rig.capture(VllmAsgi()), "/v1/responses", request("completion", False))
    assert skipped("path") == before + 1
    assert rig.rows() == []


def test_a_server_without_per_request_metrics_gives_no_row(rig: Rig) -> None:
    before = skipped("metrics")
    call(rig.capture(VllmAsgi(spec_metrics=False)), PATHS["chat"], request("chat", False))
    assert skipped("metrics") == before + 1
    assert rig.rows() == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_response_without_token_ids_gives_no_row(rig: Rig, stream: bool) -> None:
    before = skipped("token-ids")
    off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], request("chat", stream))
    assert call(rig.capture(VllmAsgi(hide_ids=True)), PATHS["chat"], request("chat", stream)).body == off.body
    assert skipped("token-ids") == before + 1
    assert rig.rows() == []


def test_with_speculation_off_a_row_says_nothing_was_drafted(rig: Rig) -> None:
    rig.set(k=0)
    call(rig.capture(VllmAsgi(spec_metrics=False)), PATHS["chat"], request("chat", True))
    (row,) = rig.rows()
    assert row["k"] == 0
    assert row["acceptance"] == {"mean_acceptance_length": 0.0, "draft_acceptance_rate": 0.0, "num_spec_steps": 0,
                                 "num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "num_spec_tokens": 0,
                                 "acceptance_histogram": []}  # fmt: skip


def test_logprobs_and_grammars_are_on_policy(rig: Rig) -> None:
    """Lossless under the rejection sampler: applied to the verifier's logits before the accept test."""
    extra = {"logprobs": True, "top_logprobs": 2, "response_format": {"type": "json_object"}, "presence_penalty": 0.5}
    call(rig.capture(VllmAsgi()), PATHS["chat"], request("chat", False, **extra))
    (row,) = rig.rows()
    assert json.loads(row["sampling"])["response_format"] == {"type": "json_object"}


def test_below_threshold_keeps_only_the_requests_the_draft_serves_worst(rig: Rig) -> None:
    rig.set(mode="BelowThreshold", threshold=0.5)
    capture = rig.capture(VllmAsgi())
    for seed in (1, 4, 5, 9, 2):
        for stream in (False, True):
            call(capture, PATHS["chat"], request("chat", stream, seed=seed))
    rates = sorted(r["acceptance"]["draft_acceptance_rate"] for r in rig.rows())
    assert rates == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.4, 0.4])


def test_the_hourly_budget_is_per_clock_hour(rig: Rig) -> None:
    rig.set(maxPerHour=2)
    capture = rig.capture(VllmAsgi())
    before = skipped("budget")
    for _ in range(4):
        call(capture, PATHS["completion"], request("completion", False))
    assert skipped("budget") == before + 2
    rig.now += 3600
    call(capture, PATHS["completion"], request("completion", False))
    assert len(rig.rows()) == 3


def test_a_share_of_zero_captures_nothing(rig: Rig) -> None:
    rig.set(maxPerHour=0)
    call(rig.capture(VllmAsgi()), PATHS["chat"], request("chat", False))
    assert rig.rows() == []


def test_the_fraction_samples(rig: Rig) -> None:
    rig.set(fraction=0.25)
    server = VllmAsgi()
    for draw in (0.1, 0.24, 0.25, 0.9):
        call(rig.capture(server, draw=draw), PATHS["chat"], request("chat", False))
    assert [bool(r.get("return_token_ids")) for r in server.received] == [True, True, False, False]


# ---- redaction ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "change"),
    [(r"\b\d{16}\b", {"messages": [{"role": "user", "content": "card 4111111111111111 please"}]}),
     ("Bonj[o]ur", {}),  # the completion's text
     ("secret-tool", {"tools": [{"type": "function", "function": {"name": "secret-tool"}}]})],
    ids=["prompt", "completion", "tools"],
)  # fmt: skip
def test_a_row_whose_text_matches_a_redaction_is_never_written(rig: Rig, pattern: str, change: dict[str, Any]) -> None:
    rig.set(redact=[{"pattern": "never-matches"}, {"pattern": pattern}])
    before = skipped("redacted")
    body = request("chat", False, **change)
    off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], body)
    assert call(rig.capture(VllmAsgi()), PATHS["chat"], body).body == off.body
    assert skipped("redacted") == before + 1
    assert rig.rows() == []


def test_with_redactions_a_prompt_of_token_ids_is_not_captured(rig: Rig) -> None:
    rig.set(redact=[{"pattern": "x"}])
    before = skipped("redacted")
    call(rig.capture(VllmAsgi()), PATHS["completion"], request("completion", False, prompt=[5, 6, 7]))
    assert skipped("redacted") == before + 1


# ---- the spool and storage ---------------------------------------------------------------------------------------


def test_a_full_spool_drops_and_the_response_does_not_wait(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_rows=2, shard_rows=1)
    rig.memory.gate = threading.Event()  # storage hangs
    try:
        capture = rig.capture(VllmAsgi())
        before = outcome("dropped")
        off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], request("chat", True))
        for _ in range(5):
            assert call(capture, PATHS["chat"], request("chat", True)).body == off.body
        assert rig.memory.entered.wait(10)
        assert not rig.memory.gate.is_set()  # all five served while the writer was stuck
        assert outcome("dropped") == before + 3  # one being written, one queued, three did not fit
        captured = outcome("captured")
        rig.memory.gate.set()
        assert rig.spool.flush()
        assert outcome("captured") == captured + 2
    finally:
        rig.memory.gate.set()
        rig.spool.close(5)


def test_the_rows_being_gathered_count_against_the_spools_bytes(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_bytes=600)  # room for a request, not for its response too
    try:
        before = outcome("dropped")
        off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], request("chat", True))
        assert call(rig.capture(VllmAsgi()), PATHS["chat"], request("chat", True)).body == off.body
        assert outcome("dropped") == before + 1
        assert rig.rows() == []
        assert rig.spool.rows == 0
    finally:
        rig.spool.close(5)


def test_storage_failing_serves_every_response_and_counts_the_dropped(rig: Rig) -> None:
    rig.memory.failure = OSError("connection refused: captures.example:9000")
    before = outcome("dropped"), count(podcontract.CAPTURE_ERRORS_METRIC, kind="storage")
    capture = rig.capture(VllmAsgi())
    off = call(VllmAsgi(spec_metrics=False), PATHS["completion"], request("completion", False))
    for _ in range(3):
        assert call(capture, PATHS["completion"], request("completion", False)).body == off.body
    assert rig.spool.flush()
    assert outcome("dropped") == before[0] + 3
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="storage") > before[1]
    rig.memory.failure = None  # storage back: the next rows are written
    call(capture, PATHS["completion"], request("completion", False))
    eventually(lambda: assert_rows(rig, 1), timeout=10, interval=0.05)


def assert_rows(rig: Rig, n: int) -> None:
    assert len(rig.rows()) == n


def test_shards_are_written_at_their_row_count_and_counted(tmp_path: Path) -> None:
    rig = Rig(tmp_path, shard_rows=2)
    try:
        before = outcome("captured"), count(podcontract.CAPTURE_BYTES_METRIC)
        capture = rig.capture(VllmAsgi())
        for _ in range(4):
            call(capture, PATHS["chat"], request("chat", False))
        eventually(lambda: assert_shards(rig, 2), timeout=10, interval=0.05)
        assert outcome("captured") == before[0] + 4
        assert count(podcontract.CAPTURE_BYTES_METRIC) == before[1] + sum(map(len, rig.memory.shards.values()))
    finally:
        rig.spool.close(5)


def assert_shards(rig: Rig, n: int) -> None:
    assert len(rig.memory.shards) == n


def test_a_pvc_shard_appears_whole_under_its_key(tmp_path: Path) -> None:
    PvcWriter(tmp_path).write("live/team/qwen/v/d/x.jsonl", b'{"a":1}\n')
    assert (tmp_path / "live/team/qwen/v/d/x.jsonl").read_bytes() == b'{"a":1}\n'
    assert [p.name for p in (tmp_path / "live/team/qwen/v/d").iterdir()] == ["x.jsonl"]  # no temporary left


def test_an_s3_shard_is_one_put_object() -> None:
    class Client:
        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def put_object(self, **kwargs: Any) -> None:
            self.calls.append(kwargs)

    client = Client()
    S3Writer("captures", client).write("live/x.jsonl", b"row\n")
    assert client.calls == [{"Bucket": "captures", "Key": "live/x.jsonl", "Body": b"row\n",
                             "ContentType": "application/x-ndjson"}]  # fmt: skip


def test_the_shard_key_names_deployment_revisions_time_pod_and_sequence() -> None:
    from datetime import UTC, datetime

    key = ShardKey("s3://b/p", "/mnt", "team", "qwen", "sha256:ab", "d/1")
    name = shard_name(key, "p", datetime(2026, 12, 7, 19, 5, 3, tzinfo=UTC), "qwen-0", "7-000001")
    assert name == "p/team/qwen/sha256:ab/d_1/20261207T190503Z-qwen-0-7-000001.jsonl"


# ---- settings, live ----------------------------------------------------------------------------------------------


def test_a_change_of_the_settings_file_is_picked_up_live(rig: Rig) -> None:
    server = VllmAsgi()
    capture = rig.capture(server, draw=0.5)
    rig.set(fraction=0.1)
    call(capture, PATHS["chat"], request("chat", False))
    rig.set(fraction=0.9)
    call(capture, PATHS["chat"], request("chat", False))
    rig.set(fraction=0.9, enabled=False)
    call(capture, PATHS["chat"], request("chat", False))
    assert [bool(r.get("return_token_ids")) for r in server.received] == [False, True, False]


def test_the_file_is_looked_at_no_more_often_than_the_check_interval(tmp_path: Path) -> None:
    now = [0.0]
    path = settings_file(tmp_path / "c.json", fraction=0.1)
    live = LiveSettings(str(path), check_seconds=2.0, clock=lambda: now[0])
    assert live.current().settings.fraction == 0.1  # type: ignore[union-attr]
    settings_file(path, fraction=0.7)
    now[0] = 1.5
    assert live.current().settings.fraction == 0.1  # type: ignore[union-attr]
    now[0] = 2.0
    assert live.current().settings.fraction == 0.7  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "content",
    ['{"fraction": 1', '{"fraction": 2}', "[]", '{"fraction":1,"redact":[{"pattern":"(unclosed"}]}'],
    ids=["not-json", "out-of-range", "not-an-object", "bad-redaction"],
)
def test_bad_settings_turn_the_capture_off_not_the_server(rig: Rig, content: str) -> None:
    good = json.loads(rig.path.read_text())
    rig.path.write_text(content if "redact" not in content else json.dumps({**good, **json.loads(content)}))
    before = count(podcontract.CAPTURE_ERRORS_METRIC, kind="config")
    server = VllmAsgi()
    off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], request("chat", False))
    on = call(rig.capture(server), PATHS["chat"], request("chat", False))
    assert on.body == off.body  # served, the flag's metrics removed
    assert "return_token_ids" not in server.received[-1]
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="config") == before + 1
    call(rig.capture(server), PATHS["chat"], request("chat", False))
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="config") == before + 1  # one failure, counted once
    assert rig.rows() == []


def test_no_settings_file_captures_nothing(tmp_path: Path) -> None:
    spool = Spool(writers=lambda key: (Memory(), ""), pod="p")
    capture = Capture(VllmAsgi(), settings=LiveSettings(str(tmp_path / "absent.json")), spool=spool, draw=lambda: 0.0)
    off = call(VllmAsgi(spec_metrics=False), PATHS["completion"], request("completion", True))
    assert call(capture, PATHS["completion"], request("completion", True)).body == off.body
    assert spool.rows == 0


def test_the_settings_model_reads_what_the_operator_writes() -> None:
    written = CaptureSettings(
        fraction=0.1, max_per_hour=900, location="pvc://claim/captures", namespace="n", deployment="d",
        served_model="m", verifier_revision="v", draft_revision="r", k=3,
    )  # fmt: skip
    wire_json = written.model_dump_json(by_alias=True)
    assert '"maxPerHour":900' in wire_json
    assert CaptureSettings.model_validate_json(wire_json) == written
    assert CaptureSettings.model_validate_json(wire_json[:-1] + ',"newerField":1}') == written


# ---- user data stays out of logs ---------------------------------------------------------------------------------


def test_nothing_captured_reaches_a_log(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    rig.set(redact=[{"pattern": f"{MARKER}-redacted"}])
    capture = rig.capture(VllmAsgi())
    rig.memory.failure = OSError("refused")
    for stream in (False, True):
        for kind in ("chat", "completion"):
            marked = ({"messages": [{"role": "user", "content": f"tell {MARKER}"}]} if kind == "chat"
                      else {"prompt": f"tell {MARKER}"})  # fmt: skip
            redacted = ({"messages": [{"role": "user", "content": f"tell {MARKER}-redacted"}]} if kind == "chat"
                        else {"prompt": f"tell {MARKER}-redacted"})  # fmt: skip
            call(capture, PATHS[kind], request(kind, stream, **marked, stop=[MARKER]))
            call(capture, PATHS[kind], request(kind, stream, **marked, model=f"{MARKER}-lora"))
            call(capture, PATHS[kind], request(kind, stream, **redacted))
    call(capture, PATHS["chat"], f'{{"messages": "{MARKER}'.encode())
    rig.spool.flush()
    rig.path.write_text(f'{{"fraction": "{MARKER}", "redact": [{{"pattern": "({MARKER}"}}]}}')
    call(capture, PATHS["chat"], request("chat", False))
    assert caplog.records  # the failures were logged
    for record in caplog.records:
        assert MARKER not in record.getMessage()
        assert MARKER not in (record.exc_text or "")


# ---- the pure parts ----------------------------------------------------------------------------------------------


def test_the_metrics_tail_is_the_top_level_member_only() -> None:
    nested = b'{"a":{"b":1,"metrics":{"speculative_decoding":{"x":1}}}}'
    assert wire.strip_json_metrics(nested, timing=False) == nested
    transfer = b'{"kv_transfer_params":{"metrics":{"speculative_decoding":1}},"metrics":'
    top = transfer + b'{"q":null,"speculative_decoding":{"x":1}}}'
    assert wire.strip_json_metrics(top, timing=False) == transfer + b"null}"
    assert wire.strip_json_metrics(top, timing=True) == transfer + b'{"q":null,"speculative_decoding":null}}'
    event = b'{"usage":{},"metrics":{"a":1.5,"speculative_decoding":{"x":[1]}}}'
    assert wire.strip_event_metrics(event, timing=True) == b'{"usage":{},"metrics":{"a":1.5}}'
    assert wire.strip_event_metrics(event, timing=False) == b'{"usage":{}}'
    assert wire.strip_event_ids(b'{"text":"\\"token_ids\\":[1]","token_ids":[1, 2]}') == (
        b'{"text":"\\"token_ids\\":[1]","token_ids":null}')  # fmt: skip


def test_events_are_split_wherever_the_bytes_are_cut() -> None:
    stream = b"data: {}\n\n: keep-alive\n\ndata: [DONE]\n\n"
    for size in range(1, len(stream) + 1):
        events = wire.Events()
        out = [e for i in range(0, len(stream), size) for e in events.feed(stream[i : i + size])]
        assert out == [b"data: {}\n\n", b": keep-alive\n\n", b"data: [DONE]\n\n"]
        assert events.rest() == b""


def test_the_routes() -> None:
    assert policy.route("POST", "/v1/chat/completions") == "chat"
    assert policy.route("POST", "/v1/completions") == "completion"
    assert policy.route("POST", "/invocations") == "other"
    assert policy.route("GET", "/v1/completions") is None
    assert policy.route("POST", "/tokenize") is None


# ---- fail open ---------------------------------------------------------------------------------------------------


class Garbled(VllmAsgi):
    """A server whose 200 answers the capture cannot read: a body that is not JSON, a stream event that is not."""

    def whole(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == PATHS["chat"]:
            await self._json(send, 200, b'{"choices": [oops')
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for piece in (b'data: {"choices":[{"token_ids":[1]}]}\n\n', b"data: {oops\n\n", b"data: [DONE]\n\n"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_a_response_the_capture_cannot_read_reaches_the_client_as_the_server_sent_it(rig: Rig) -> None:
    before = count(podcontract.CAPTURE_ERRORS_METRIC, kind="capture")
    whole = call(rig.capture(Garbled()), PATHS["chat"], request("chat", False))
    assert (whole.status, whole.body) == (200, b'{"choices": [oops')
    streamed = call(rig.capture(Garbled()), PATHS["completion"], request("completion", True))
    assert streamed.body == b'data: {"choices":[{"token_ids":null}]}\n\ndata: {oops\n\ndata: [DONE]\n\n'
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="capture") == before + 2
    assert rig.rows() == []


def test_a_failure_in_the_capture_passes_the_request_through(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(policy, "request_skip", broken)
    before = count(podcontract.CAPTURE_ERRORS_METRIC, kind="capture")
    server = VllmAsgi()
    off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], request("chat", False))
    assert call(rig.capture(server), PATHS["chat"], request("chat", False)).body == off.body
    assert "return_token_ids" not in server.received[-1]
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="capture") == before + 1


@pytest.mark.parametrize("streamed", [False, True], ids=["body", "stream"])
def test_a_failure_once_the_response_is_whole_gives_the_client_its_answer(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(policy, "build_row", broken)  # runs inside vLLM's send, after the response was read
    before = count(podcontract.CAPTURE_ERRORS_METRIC, kind="capture")
    off = call(VllmAsgi(spec_metrics=False), PATHS["chat"], request("chat", streamed))
    got = call(rig.capture(VllmAsgi()), PATHS["chat"], request("chat", streamed))
    assert (got.status, got.body) == (off.status, off.body)
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="capture") == before + 1


def test_a_lone_surrogate_in_a_request_still_makes_a_row() -> None:
    line = policy.encode_row({"tools": '[{"name": "\ud83d"}]', "input_ids": [1, 2]})
    assert json.loads(line)["tools"] == '[{"name": "\ud83d"}]'
