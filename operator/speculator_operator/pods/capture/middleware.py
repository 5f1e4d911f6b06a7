"""`Capture`: the ASGI middleware vLLM's API server adds with `--middleware
speculator_operator.pods.capture.middleware.Capture` (Starlette builds it as `Capture(app)`; plain ASGI, so the
package needs neither Starlette nor FastAPI). It sits outside vLLM's own middlewares, so it sees every request
before authentication: it stores no header, and captures only what was answered with status 200.

A request not sampled passes through untouched but for the speculative-decoding metrics that the per-request flag
(`--per-request-spec-decode-metrics`, which the capture needs) adds to its response: they are removed, unless the
user asked for the flag. A sampled request of /v1/chat/completions or /v1/completions that may be on-policy is sent
on asking for its token ids (and, streaming, for the usage chunk that carries the metrics); its response is read as
it passes, and the client gets exactly what it would have had without the capture: the token ids, the added usage
chunk and the metrics are taken out again. A stream is rewritten event by event as vLLM sends it, never held back;
a non-streaming body is held whole (vLLM sends it in one message anyway) to set its Content-Length.

The row goes to the spool (pods/capture/spool.py) when the response ends; the row's memory while it is gathered
counts against the spool's bound. Fail open: anything that goes wrong in the capture forwards the server's bytes
as they came and counts an error; the client never gets an error from the capture."""

from __future__ import annotations

import atexit
import json
import logging
import random
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speculator_operator.pods.capture import metrics, policy, wire
from speculator_operator.pods.capture.config import Active, LiveSettings
from speculator_operator.pods.capture.policy import Asked, Completion, Kind, Skip
from speculator_operator.pods.capture.retention import Retention
from speculator_operator.pods.capture.spool import ShardKey, Spool

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)
SSE = b"text/event-stream"
JSON = b"application/json"


def _header(message: Message, name: bytes) -> bytes:
    for key, value in message.get("headers") or []:
        if key.lower() == name:
            return bytes(value)
    return b""


def _mode(start: Message) -> str | None:
    """How a response is read: "sse" (an event stream), "json" (one body), None (not at all: another type, or
    encoded bytes)."""
    if _header(start, b"content-encoding"):
        return None
    ctype = _header(start, b"content-type")
    return "sse" if ctype.startswith(SSE) else "json" if ctype.startswith(JSON) else None


def _with_length(message: Message, length: int) -> Message:
    headers = [(k, v) for k, v in message.get("headers") or [] if k.lower() != b"content-length"]
    return {**message, "headers": [*headers, (b"content-length", str(length).encode())]}


class _Strip:
    """What the flag added, removed from a response the capture does not read (or no longer reads)."""

    def __init__(self, send: Send, *, keep: bool, timing: bool) -> None:
        self.downstream = send
        self.keep, self.timing = keep, timing
        self.mode: str | None = None  # "sse", "json", or None: forwarded untouched
        self.start: Message | None = None
        self.chunks: list[bytes] = []
        self.events = wire.Events()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if not self.keep and message["status"] == 200:
                self.mode = _mode(message)
            if self.mode == "json":
                self.start = message  # held until the body is whole: its length changes
                return
        elif kind == "http.response.body" and self.mode is not None:
            body, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
            if self.mode == "sse":
                await self.downstream({**message, "body": self._events(body, more)})
                return
            self.chunks.append(body)
            if more:
                return
            out = self._json(b"".join(self.chunks))
            assert self.start is not None
            await self.downstream(_with_length(self.start, len(out)))
            await self.downstream({**message, "body": out})
            return
        await self.downstream(message)

    def _events(self, body: bytes, more: bool) -> bytes:
        out = [self._rewritten(event) for event in self.events.feed(body)]
        if not more:
            out.append(self.events.rest())
        return b"".join(out)

    def _rewritten(self, event: bytes) -> bytes:
        """An event with what the flag (and the capture) added removed; as it came where that fails."""
        data = wire.event_json(event)
        if data is None:
            return event
        try:
            return wire.DATA + self._rewrite(data) + wire.EVENT_END
        except Exception:
            metrics.ERRORS.labels("capture").inc()
            return event

    def _rewrite(self, data: bytes) -> bytes:
        return data if self.keep else wire.strip_event_metrics(data, timing=self.timing)

    def _json(self, body: bytes) -> bytes:
        if self.keep:
            return body
        try:
            return wire.strip_json_metrics(body, timing=self.timing)
        except Exception:  # forwarded as it came
            metrics.ERRORS.labels("capture").inc()
            return body


class _Gather(_Strip):
    """A sampled request's response: read into a row as it passes, and given to the client as it would have been
    without the capture."""

    def __init__(
        self, capture: Capture, send: Send, kind: Kind, request: dict[str, Any], asked: Asked, active: Active,
        reserved: int,
    ) -> None:  # fmt: skip
        settings = active.settings
        super().__init__(send, keep=settings.keep_metrics, timing=settings.timing_metrics)
        self.capture, self.kind, self.request, self.asked, self.active = capture, kind, request, asked, active
        self.reserved = reserved
        self.done = Completion()
        self.ids: list[int] = []
        self.pieces: dict[str, list[str]] = {"content": [], "reasoning": [], "text": []}
        self.calls: dict[int, dict[str, Any]] = {}
        self.settled = False
        self.broken = False  # the response could not be read: forwarded with what the flag added removed only
        # with the usage chunk the capture asked for, vLLM stamps its system_fingerprint on that chunk instead of
        # the terminal one (chat_completion/serving.py): the terminal chunk waits for it, and gets it back
        self.terminal: list[bytes] = []

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if message["status"] != 200:
                self.settle(Skip.STATUS)
                self.mode = None
            else:
                self.mode = _mode(message)
                if self.mode is None:
                    self.settle(Skip.BODY)
            if self.mode == "json":
                self.start = message
                return
            await self.downstream(message)
            return
        await super().send(message)

    # ---- a stream, event by event ------------------------------------------------------------------------

    def _events(self, body: bytes, more: bool) -> bytes:
        if self.broken:
            return super()._events(body, more)
        out = []
        for event in self.events.feed(body):
            try:
                out.append(self._event(event))
            except Exception:
                self._break()
                out.append(self._release(None))
                out.append(self._rewritten(event))
        if not more:
            out.append(self._release(None))
            out.append(self.events.rest())
            self.finish()
        return b"".join(out)

    def _release(self, fingerprint: Any) -> bytes:
        """The terminal chunks held for the usage chunk, as vLLM would have sent them without it: with the
        fingerprint as their last field (where its model puts it when usage is not asked for)."""
        held, self.terminal = self.terminal, []
        if fingerprint is not None:
            tail = b',"system_fingerprint":' + json.dumps(fingerprint, ensure_ascii=False).encode() + b"}"
            held = [data[:-1] + tail for data in held]
        return b"".join(wire.DATA + data + wire.EVENT_END for data in held)

    def _event(self, event: bytes) -> bytes:
        data = wire.event_json(event)
        if data is None:
            return self._release(None) + event  # a keep-alive comment, [DONE]: a held terminal chunk goes first
        chunk = json.loads(data)
        if not self.settled:
            self._hold(len(data))
            self._gather(chunk)
        if self._added(chunk):
            if self.asked.usage and chunk.get("choices") == []:
                return self._release(chunk.get("system_fingerprint"))
            return b""
        choices = chunk.get("choices")
        if self.asked.usage and isinstance(choices, list) and any(c.get("finish_reason") for c in choices):
            self.terminal.append(self._rewrite(data))
            return b""
        return self._release(None) + wire.DATA + self._rewrite(data) + wire.EVENT_END

    def _rewrite(self, data: bytes) -> bytes:
        data = super()._rewrite(data)
        return wire.strip_event_ids(data) if self.asked.token_ids else data

    def _added(self, chunk: dict[str, Any]) -> bool:
        """A chunk the client would not have had: the usage chunk the capture asked for, or a chat chunk with no
        text that vLLM sends only to carry token ids (a parser held the text back)."""
        choices = chunk.get("choices")
        if self.asked.usage and choices == [] and "usage" in chunk:
            return True
        return (
            self.kind == "chat"
            and self.asked.token_ids
            and not self.asked.logprobs
            and isinstance(choices, list)
            and bool(choices)
            and "usage" not in chunk
            and all(c.get("delta") == {} and c.get("finish_reason") is None for c in choices)
        )

    def _gather(self, chunk: dict[str, Any]) -> None:
        done = self.done
        if "error" in chunk:
            done.error = True
        if isinstance(chunk.get("model"), str):
            done.model = chunk["model"]
        if self.kind == "chat" and isinstance(chunk.get("prompt_token_ids"), list):
            done.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("metrics") is not None:
            done.metrics = chunk["metrics"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("token_ids"), list):
                self.ids.extend(choice["token_ids"])
            if choice.get("finish_reason"):
                done.finish_reason = choice["finish_reason"]
            if self.kind == "completion":
                if isinstance(choice.get("prompt_token_ids"), list):
                    done.prompt_ids = choice["prompt_token_ids"]
                if choice.get("text"):
                    self.pieces["text"].append(choice["text"])
                continue
            delta = choice.get("delta") or {}
            for key in ("content", "reasoning"):
                if delta.get(key):
                    self.pieces[key].append(delta[key])
            for call in delta.get("tool_calls") or []:
                self._call(call)

    def _call(self, delta: dict[str, Any]) -> None:
        """A streamed tool call's part: its first part names it, later ones add to its arguments."""
        call = self.calls.setdefault(int(delta.get("index", 0)), {"function": {"arguments": ""}})
        for key in ("id", "type"):
            if delta.get(key):
                call[key] = delta[key]
        function = delta.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        call["function"]["arguments"] += function.get("arguments") or ""

    def _streamed(self) -> Completion:
        done = self.done
        done.ids = self.ids or None
        if self.kind == "chat":
            done.text = {
                "role": "assistant",
                "content": "".join(self.pieces["content"]) or None,
                "reasoning_content": "".join(self.pieces["reasoning"]) or None,
                "tool_calls": [self.calls[i] for i in sorted(self.calls)],
            }
        else:
            done.text = {"text": "".join(self.pieces["text"])}
        return done

    # ---- a whole body ------------------------------------------------------------------------------------

    def _json(self, body: bytes) -> bytes:
        if self.broken:
            return super()._json(body)
        try:
            answer = json.loads(body)
            if not self.settled:
                self._hold(len(body))
                self.done = policy.read_response(self.kind, answer)
            if self.asked.token_ids:
                wire.strip_body_ids(answer)
            spec = answer.get("metrics")
            if not self.keep and isinstance(spec, dict) and spec.get("speculative_decoding") is not None:
                answer["metrics"] = {**spec, "speculative_decoding": None} if self.timing else None
            out = wire.dump_body(answer)
        except Exception:
            self._break()
            return body
        self.finish()
        return out

    # ---- the row -----------------------------------------------------------------------------------------

    def _hold(self, size: int) -> None:
        """Count what the row keeps of the response against the spool's bound (no room: the row is dropped)."""
        if self.capture.spool.reserve(size):
            self.reserved += size
        else:
            self.settle("dropped")

    def _break(self) -> None:
        metrics.ERRORS.labels("capture").inc()
        self.broken = True
        self.settle(Skip.BODY)

    def finish(self) -> None:
        """The response is whole: the row is built and queued, or the request counted skipped or dropped. It runs
        inside vLLM's `send`: whatever fails here is counted and the request skipped, never raised to the client."""
        try:
            self._finish()
        except Exception as exc:
            _failed(exc)
            self.settle(Skip.BODY)

    def _finish(self) -> None:
        if self.settled:
            return
        done = self._streamed() if self.mode == "sse" else self.done
        settings = self.active.settings
        reason = policy.response_skip(settings, done)
        if reason is None and policy.redaction_hit(self.active.patterns, done.text):
            reason = Skip.REDACTED
        now = self.capture.clock()
        if reason is None and not self.capture.budget.take(now, settings.max_per_hour):
            reason = Skip.BUDGET
        if reason is not None:
            self.settle(reason)
            return
        row = policy.build_row(self.kind, self.request, done, settings, row_id=uuid.uuid4().hex,
                               captured_at=datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))  # fmt: skip
        key = ShardKey(settings.location, settings.pvc_mount, settings.namespace, settings.deployment,
                       settings.verifier_revision, settings.draft_revision)  # fmt: skip
        self.capture.spool.tune(settings.shard_rows, settings.shard_seconds)
        queued = self.capture.spool.put(key, policy.encode_row(row), self.reserved)
        self.reserved = 0
        self.settle(None if queued else "dropped")

    def settle(self, outcome: Skip | str | None) -> None:
        """The request's outcome, counted once: skipped with a reason, "dropped", or None (queued: counted captured
        once its shard is written)."""
        if self.settled:
            return
        self.settled = True
        if self.reserved:
            self.capture.spool.release(self.reserved)
            self.reserved = 0
        if isinstance(outcome, Skip):
            metrics.skipped(outcome)
        elif outcome == "dropped":
            metrics.dropped()


class Capture:
    """The middleware. Keyword arguments are for tests: Starlette passes only the app."""

    def __init__(
        self,
        app: App,
        *,
        settings: LiveSettings | None = None,
        spool: Spool | None = None,
        draw: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.settings = settings or LiveSettings()
        self.retention = Retention(lambda: self.settings.last_good)
        if settings is None:  # built by vLLM, which passes the app alone: this process sweeps expired shards
            self.retention.start()
        self._spool = spool
        self.draw = draw or random.Random().random  # noqa: S311 - a sample of traffic, not a secret
        self.clock = clock
        self.budget = policy.Budget()

    @property
    def spool(self) -> Spool:
        if self._spool is None:
            self._spool = Spool()
            atexit.register(self._spool.close, 5.0)  # the last shard is written when the server stops
        return self._spool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            strip, sampled = self._plan(scope, send)
        except Exception as exc:
            _failed(exc)
            strip, sampled = None, None
        if strip is None:
            await self.app(scope, receive, send)
        elif sampled is None:
            await self.app(scope, receive, strip.send)
        else:
            await self._sampled(scope, receive, strip, *sampled)

    def _plan(self, scope: Scope, send: Send) -> tuple[_Strip | None, tuple[Kind, Active] | None]:
        """The response's stripper (None: not a generating route, left alone), and the route's kind with the
        settings when the request is sampled for capture (None: passed through, the flag's metrics removed)."""
        found = policy.route(scope.get("method", ""), scope.get("path", ""))
        if found is None:
            return None, None
        keep, timing = self.settings.keeps()
        strip = _Strip(send, keep=keep, timing=timing)
        active = self.settings.current()
        if active is None or not policy.is_sampled(active.settings.fraction, self.draw()):
            return strip, None
        if found == "other":
            metrics.skipped(Skip.PATH)
            return strip, None
        if self.budget.exhausted(self.clock(), active.settings.max_per_hour):
            metrics.skipped(Skip.BUDGET)
            return strip, None
        return strip, (found, active)

    async def _sampled(self, scope: Scope, receive: Receive, strip: _Strip, kind: Kind, active: Active) -> None:
        read: list[Message] = []
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        sent: bytes | None = None
        gather: _Gather | None = None
        if read[-1]["type"] == "http.request":  # else the client left: vLLM sees that as it would have
            try:
                sent, gather = self._prepare(kind, read, active, strip)
            except Exception as exc:
                _failed(exc)
                sent, gather = None, None
        if sent is None or gather is None:
            await self.app(scope, _replay(read, receive), strip.send)
            return
        headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(sent)).encode())]}
        try:
            await self.app(scope, _replay([{"type": "http.request", "body": sent, "more_body": False}], receive),
                           gather.send)  # fmt: skip
        finally:
            gather.settle(Skip.STATUS)  # no whole response (the server failed, or the client left): no row

    def _prepare(
        self, kind: Kind, read: list[Message], active: Active, strip: _Strip
    ) -> tuple[bytes | None, _Gather | None]:
        """The request body to send instead, and the reader of its response; (None, None) when it is not captured
        (counted here)."""
        raw = b"".join(bytes(m.get("body", b"")) for m in read)
        try:
            request = json.loads(raw)
        except ValueError:
            request = None
        reason = self._skip(kind, request, active)
        if reason is not None:
            metrics.skipped(reason)
            return None, None
        if not self.spool.reserve(len(raw)):
            metrics.dropped()
            return None, None
        try:
            body, asked = policy.ask(request, force_include_usage=active.settings.force_include_usage)
            # ASCII escapes: a lone surrogate the client escaped stays valid
            sent = json.dumps(body).encode()
            return sent, _Gather(self, strip.downstream, kind, request, asked, active, len(raw))
        except Exception:
            self.spool.release(len(raw))  # the caller counts the failure and passes the request through
            raise

    @staticmethod
    def _skip(kind: Kind, request: Any, active: Active) -> Skip | None:
        """Why the request is not captured, known before the server answers (None: it may be)."""
        reason = policy.request_skip(kind, request)
        if reason is not None:
            return reason
        patterns = active.patterns
        texts = policy.request_texts(kind, request)
        if patterns and (policy.prompt_is_ids(kind, request) or policy.redaction_hit(patterns, *texts)):
            return Skip.REDACTED
        return None


def _failed(exc: Exception) -> None:
    """Count and log a failure of the capture: the exception's type and where it was raised, never its words (they
    may quote the request)."""
    metrics.ERRORS.labels("capture").inc()
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    log.warning("capture: a request passed through untouched: %s at %s", type(exc).__name__, where)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives these messages first, then the client's own (its disconnect)."""
    queue = list(messages)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed
