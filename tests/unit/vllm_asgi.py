"""A stand-in for vLLM 0.32's OpenAI server as an ASGI app, for the capture middleware's tests: /v1/chat/completions
and /v1/completions answer as vLLM writes them (vllm/entrypoints/openai/{chat_completion,completion}/serving.py and
api_router.py), deterministically (fixed ids and times):

- non-streaming: Starlette's JSONResponse of the whole model (every field, None as null), `metrics` null unless the
  server has --per-request-spec-decode-metrics, `prompt_token_ids` / `token_ids` lists only with return_token_ids;
- streaming: `data: <json>\\n\\n` events of the chunks with unset fields left out (explicitly passed None kept, as
  pydantic's exclude_unset does), `: keep-alive` comments between them, a chat chunk with an empty delta sent only
  to carry token ids where a parser holds text back, the final usage chunk (with the metrics) only with
  stream_options.include_usage, then `data: [DONE]`; with `split`, events are cut across ASGI messages and merged.

The completion is the same five tokens every time; the request's `seed` sets its draft acceptance rate (seed / 10),
its `model` the model the response names (another name stands for a LoRA adapter), and `min_p` gets a 400."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Message = MutableMapping[str, Any]
SERVED = "tiny-verifier"
COMPLETION = [(101, "Bonjour"), (102, " à"), (103, " toi"), (104, " →!"), (2, "")]
HELD_BACK = 103  # the chat parser holds this token's text back, sending it with the next one
FINGERPRINT = "vllm-0.32.0-f028703d"  # config-derived, the same on every response of a server


def prompt_ids(body: dict[str, Any]) -> list[int]:
    if "messages" in body:
        words = [w for m in body["messages"] for w in str(m.get("content") or "").split()]
        return [1, 7, *(10 + len(w) for w in words), 8]
    prompt = body["prompt"]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    text = " ".join(prompt) if isinstance(prompt, list) else prompt  # a batch: one answer stands for all here
    return [1, *(10 + len(w) for w in text.split())]


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass
class VllmAsgi:
    spec_metrics: bool = True  # --per-request-spec-decode-metrics summary
    timing: bool = False  # --enable-per-request-metrics
    split: bool = False
    hide_ids: bool = False  # token ids withheld, as vLLM does with hidden reasoning (include_reasoning false)
    received: list[dict[str, Any]] = field(default_factory=list)

    def spec(self, body: dict[str, Any], streamed: bool) -> dict[str, Any]:
        rate = float(body.get("seed", 5)) / 10
        out: dict[str, Any] = {
            "mean_acceptance_length": 1 + 3 * rate, "draft_acceptance_rate": rate, "acceptance_histogram": [1, 0, 1, 0],
            "num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_draft_tokens": 6, "num_spec_tokens": 3,
        }  # fmt: skip
        if not streamed:
            out.update(per_step_accepted=None, per_step_drafted=None)
        return out

    def metrics(self, body: dict[str, Any], streamed: bool) -> dict[str, Any] | None:
        if body.get("n", 1) != 1 or not (self.spec_metrics or self.timing):
            return None
        timing = {"time_to_first_token_ms": 12.5, "generation_time_ms": 40.0, "queue_time_ms": 0.25,
                  "mean_itl_ms": 7.5, "tokens_per_second": 125.0}  # fmt: skip
        out: dict[str, Any] = timing if self.timing else dict.fromkeys(timing)
        out = {**out, "speculative_decoding": self.spec(body, streamed) if self.spec_metrics else None}
        if streamed:
            out = {k: v for k, v in out.items() if v is not None}
        return out

    async def __call__(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:  # fmt: skip
        assert scope["type"] == "http"
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert int(dict(scope["headers"])[b"content-length"]) == len(raw)
        try:
            body = json.loads(raw)
        except ValueError:
            error = {"error": {"message": "invalid JSON", "type": "BadRequest", "param": None, "code": 400}}
            await self._json(send, 400, _dump(error))
            return
        self.received.append(body)
        kind = "chat" if scope["path"] == "/v1/chat/completions" else "completion"
        if "min_p" in body:
            error = {"error": {"message": "min_p is not supported with speculative decoding", "type": "BadRequest",
                               "param": None, "code": 400}}  # fmt: skip
            await self._json(send, 400, _dump(error))
        elif body.get("stream"):
            await self._stream(send, kind, body)
        else:
            await self._json(send, 200, _dump(self.whole(kind, body)))

    def _model(self, body: dict[str, Any]) -> str:
        return str(body.get("model") or SERVED)

    def _usage(self, body: dict[str, Any]) -> dict[str, Any]:
        n = len(prompt_ids(body))
        return {"prompt_tokens": n, "total_tokens": n + len(COMPLETION), "completion_tokens": len(COMPLETION),
                "prompt_tokens_details": None}  # fmt: skip

    def whole(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        ids = bool(body.get("return_token_ids")) and not self.hide_ids
        text = "".join(t for _, t in COMPLETION)
        common = {"finish_reason": "stop", "stop_reason": None}
        if kind == "chat":
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "reasoning": None}  # fmt: skip
            choice = {"index": 0, "message": message, "logprobs": None, **common,
                      "token_ids": [t for t, _ in COMPLETION] if ids else None, "routed_experts": None}  # fmt: skip
            return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": self._model(body),
                    "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": self._usage(body),
                    "prompt_logprobs": None, "prompt_token_ids": prompt_ids(body) if ids else None,
                    "prompt_text": None, "kv_transfer_params": None, "ec_transfer_params": None,
                    "metrics": self.metrics(body, False)}  # fmt: skip
        choice = {"index": 0, "text": text, "logprobs": None, **common, "prompt_logprobs": None,
                  "prompt_token_ids": prompt_ids(body) if ids else None,
                  "token_ids": [t for t, _ in COMPLETION] if ids else None, "routed_experts": None}  # fmt: skip
        return {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": self._model(body),
                "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": self._usage(body),
                "kv_transfer_params": None, "ec_transfer_params": None,
                "metrics": self.metrics(body, False)}  # fmt: skip

    def events(self, kind: str, body: dict[str, Any]) -> list[bytes]:
        ids = bool(body.get("return_token_ids")) and not self.hide_ids
        head = {"id": "chatcmpl-1" if kind == "chat" else "cmpl-1",
                "object": "chat.completion.chunk" if kind == "chat" else "text_completion", "created": 1700000000,
                "model": self._model(body)}  # fmt: skip
        out: list[dict[str, Any]] = []
        if kind == "chat":
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            out.append({**head, "choices": [first], "prompt_token_ids": prompt_ids(body) if ids else None,
                        "prompt_text": None})  # fmt: skip
            held = ""
            for i, (token, text) in enumerate(COMPLETION):
                last = i == len(COMPLETION) - 1
                if token == HELD_BACK and not last:
                    held = text
                    if not ids:
                        continue  # vLLM sends nothing for a held-back token unless token ids are asked for
                    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": None, "token_ids": [token]}
                else:
                    choice = {"index": 0, "delta": {"content": held + text}, "logprobs": None,
                              "finish_reason": "stop" if last else None}  # fmt: skip
                    if last:
                        choice["stop_reason"] = None
                    choice["token_ids"] = [token] if ids else None
                    held = ""
                out.append({**head, "choices": [choice]})
        else:
            for i, (token, text) in enumerate(COMPLETION):
                last = i == len(COMPLETION) - 1
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop" if last else None,
                          "stop_reason": None, "prompt_token_ids": prompt_ids(body) if ids and i == 0 else None,
                          "token_ids": [token] if ids else None}  # fmt: skip
                out.append({**head, "choices": [choice]})
        options = body.get("stream_options") or {}
        if not options.get("include_usage"):  # vLLM stamps its fingerprint on the terminal chunk, else on usage's
            out[-1]["system_fingerprint"] = FINGERPRINT
        if options.get("include_usage"):
            final: dict[str, Any] = {**head, "choices": [], "usage": self._usage(body)}
            del final["usage"]["prompt_tokens_details"]
            final["system_fingerprint"] = FINGERPRINT
            metrics = self.metrics(body, True)
            if metrics is not None:
                final["metrics"] = metrics
            out.append(final)
        events = [b"data: " + _dump(c) + b"\n\n" for c in out]
        events.insert(1, b": keep-alive\n\n")
        return [*events, b"data: [DONE]\n\n"]

    async def _json(self, send: Callable[[Message], Awaitable[None]], status: int, data: bytes) -> None:
        headers = [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def _stream(self, send: Callable[[Message], Awaitable[None]], kind: str, body: dict[str, Any]) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        events = self.events(kind, body)
        if self.split:  # cut each event in two, and send the second half with the next event's first
            data = b"".join(events)
            cuts = sorted({0, len(data), *(sum(len(e) for e in events[:i]) + len(events[i]) // 2
                                          for i in range(len(events)))})  # fmt: skip
            pieces = [data[a:b] for a, b in itertools.pairwise(cuts)]
        else:
            pieces = events
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
