"""The bytes of vLLM 0.32's responses, rewritten back to what the client would have had without the capture, pure.

vLLM writes a non-streaming body with Starlette's JSONResponse (`json.dumps(model_dump(), ensure_ascii=False,
separators=(",", ":"))`, every field present, `"metrics":null` without --per-request-spec-decode-metrics), and
each streamed chunk as `data: <pydantic JSON>\\n\\n` (unset or None fields left out, `metrics` absent without the
flag), with `: keep-alive` comments between. `metrics` is the last field of every response model, so the flag's
addition is a tail that is cut without parsing the body before it; the token ids a sampled request asked for are
lists of integers under two keys that appear nowhere else in a response, replaced by the `null` vLLM writes when
they were not asked for."""

from __future__ import annotations

import json
import re
from typing import Any

_METRICS = b',"metrics":'
_SPEC = b'"speculative_decoding":'
_IDS = re.compile(rb'"(prompt_token_ids|token_ids)":\[[0-9,\s-]*\]')
EVENT_END = b"\n\n"
DATA = b"data: "


def _tail_value(body: bytes, key: bytes, at: int | None = None) -> tuple[int, Any] | None:
    """Where the last `key` of the JSON object `body` starts and its value, when it is the object's last member:
    what follows it parses as one JSON value and the object's closing brace (a nested key would leave more braces,
    which do not parse). None when there is none."""
    start = body.rfind(key) if at is None else at
    if start < 0 or not body.endswith(b"}"):
        return None
    try:
        return start, json.loads(body[start + len(key) : -1])
    except ValueError:
        return None


def strip_json_metrics(body: bytes, *, timing: bool) -> bytes:
    """A non-streaming body with the flag's speculative-decoding metrics removed: `"metrics":null` as vLLM writes
    it without the flag, or with --enable-per-request-metrics only `speculative_decoding` null."""
    found = _tail_value(body, _METRICS)
    if found is None:
        return body
    start, value = found
    if not isinstance(value, dict) or value.get("speculative_decoding") is None:
        return body
    if timing:
        kept = json.dumps({**value, "speculative_decoding": None}, ensure_ascii=False, separators=(",", ":"))
        return body[:start] + _METRICS + kept.encode() + b"}"
    return body[:start] + _METRICS + b"null}"


def strip_event_metrics(data: bytes, *, timing: bool) -> bytes:
    """A streamed chunk's JSON with the flag's metrics removed: without the flag vLLM leaves `metrics` out of the
    chunk (None fields are not written), or with --enable-per-request-metrics writes it without
    `speculative_decoding`."""
    if _METRICS not in data:
        return data
    found = _tail_value(data, _METRICS)
    if found is None:
        return data
    start, value = found
    if not isinstance(value, dict) or "speculative_decoding" not in value:
        return data
    if not timing:
        return data[:start] + b"}"
    metrics = data[start + len(_METRICS) : -1]
    inner = _tail_value(metrics, _SPEC)
    if inner is None:
        return data
    cut = inner[0]
    if metrics[cut - 1 : cut] == b",":
        cut -= 1
    return data[: start + len(_METRICS)] + metrics[:cut] + b"}}"


def strip_event_ids(data: bytes) -> bytes:
    """A streamed chunk's JSON with the token ids the capture asked for written as `null`, as vLLM writes them
    when they are not asked for."""
    return _IDS.sub(rb'"\1":null', data)


def strip_body_ids(body: dict[str, Any]) -> None:
    """A parsed non-streaming body with the token ids the capture asked for set to None, in place."""
    if "prompt_token_ids" in body:
        body["prompt_token_ids"] = None
    for choice in body.get("choices") or []:
        if isinstance(choice, dict):
            for key in ("prompt_token_ids", "token_ids"):
                if key in choice:
                    choice[key] = None


def dump_body(body: dict[str, Any]) -> bytes:
    """A non-streaming body as Starlette's JSONResponse writes it."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


class Events:
    """An incremental splitter of a server-sent event stream into whole events (each with its blank line), from
    body chunks cut anywhere: an ASGI message may hold part of an event, or several."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._pending + chunk if self._pending else chunk
        out = []
        start = 0
        while True:
            end = data.find(EVENT_END, start)
            if end < 0:
                break
            out.append(data[start : end + len(EVENT_END)])
            start = end + len(EVENT_END)
        self._pending = data[start:]
        return out

    def rest(self) -> bytes:
        """What the stream ended with that is no whole event (sent on as it came)."""
        rest, self._pending = self._pending, b""
        return rest


def event_json(event: bytes) -> bytes | None:
    """The JSON of a `data: {...}` event (None for a comment, `[DONE]` or anything else)."""
    if event.startswith(DATA) and event[len(DATA) : len(DATA) + 1] == b"{":
        return event[len(DATA) : -len(EVENT_END)]
    return None
