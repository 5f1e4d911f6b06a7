"""What the capture takes, pure: which requests are eligible and why one is skipped, the sampling draw, the request
the server is sent instead (token ids and usage asked for), and the shard row built from a request and its response.
No I/O and no clock: the middleware hands in the time and the random draw.

Eligible means the completion is an on-policy sample of the served verifier (docs/concepts/learning.md#capture-in-
the-pod): decoded by vLLM 0.32's rejection sampler, which is lossless under each request's own processed
distribution (penalties, grammars and logits processors are applied to the verifier's logits before the accept
test), from the base model and not an adapter, sampled rather than searched, and a whole assistant turn."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from speculator_operator.api.podcontract import CAPTURE_SHARD_VERSION, CaptureSettings

Kind = Literal["chat", "completion"]

# the two routes whose responses carry the verifier's completion with its token ids
CAPTURED: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
# routes that generate too but are not captured (counted as skipped "path"): their request and response shapes
# differ (/v1/responses, /v1/messages, /cohere/v2/chat, /inference/v1/generate), /invocations (SageMaker) may
# switch to a LoRA adapter from a header after the body is read, a batch answers many prompts at once
OTHER_GENERATING = frozenset({
    "/v1/responses", "/v1/messages", "/invocations", "/v1/chat/completions/batch", "/inference/v1/generate",
    "/cohere/v2/chat", "/v1/audio/transcriptions", "/v1/audio/translations",
})  # fmt: skip

# the request fields recorded as its sampling parameters (the row's `sampling`); everything else of the body is
# either the prompt (messages, prompt, tools) or not about the sample (model, user, request ids, transfer params)
SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens", "min_tokens", "stop",
    "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "bad_words", "allowed_token_ids", "logprobs", "top_logprobs", "response_format",
    "structured_outputs", "tool_choice", "parallel_tool_calls", "reasoning_effort", "include_reasoning",
    "thinking_token_budget", "chat_template_kwargs", "truncate_prompt_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "stream",
)  # fmt: skip
ACCEPTANCE_INTS = ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens")
ACCEPTANCE_FLOATS = ("mean_acceptance_length", "draft_acceptance_rate")
# the acceptance of a row served with K 0: nothing drafted (the same keys and types as a measured one)
UNMEASURED: dict[str, Any] = {**dict.fromkeys(ACCEPTANCE_FLOATS, 0.0), **dict.fromkeys(ACCEPTANCE_INTS, 0),
                              "acceptance_histogram": []}  # fmt: skip


class Skip(StrEnum):
    """Why a sampled request is not captured: the `reason` label of speculator_capture_skipped_total."""

    PATH = "path"  # a generating route other than /v1/chat/completions and /v1/completions
    STATUS = "status"  # not answered with 200, or the stream carried an error
    BODY = "body"  # the request is not a JSON object of its route's shape
    ADAPTER = "adapter"  # the response names another model than the served one: a LoRA adapter answered
    BEAM_SEARCH = "beam-search"  # a search, not a sample
    PREFILL = "prefill"  # continue_final_message / add_generation_prompt false: the turn began with client text
    ECHO = "echo"  # the response text holds the prompt
    N = "n"  # n > 1: no per-request acceptance, and the prompt would count n times
    BATCH = "batch"  # a completions request with several prompts
    INPUT = "input"  # not text: images, audio, video, files, prompt embeddings
    WATERMARK = "watermark"  # a watermarked sample is keyed, not drawn from the verifier's distribution
    TOKEN_IDS = "token-ids"  # noqa: S105 - a reason, not a secret: the response holds no token ids (hidden reasoning)
    METRICS = "metrics"  # the response holds no speculative-decoding metrics (the row's acceptance)
    THRESHOLD = "threshold"  # mode BelowThreshold: the request's own acceptance is at or above the threshold
    BUDGET = "budget"  # this pod's captures of the hour are used up
    REDACTED = "redacted"  # a redaction pattern matches one of its texts (or its prompt is token ids)


def route(method: str, path: str) -> Kind | Literal["other"] | None:
    """The captured kind of a route, "other" for a generating route that is not captured, None for the rest."""
    if method != "POST":
        return None
    kind = CAPTURED.get(path)
    if kind is not None:
        return kind
    return "other" if path in OTHER_GENERATING else None


def is_sampled(fraction: float, draw: float) -> bool:
    """Whether a request with the uniform draw `draw` in [0, 1) is sampled."""
    return draw < fraction


def _truthy(body: dict[str, Any], key: str) -> bool:
    return bool(body.get(key))


def _text_only(content: Any) -> bool:
    """A message content of text alone: a string, or parts that are all text."""
    if content is None or isinstance(content, str):
        return True
    if isinstance(content, list):
        return all(isinstance(p, dict) and p.get("type") == "text" for p in content)
    return False


def request_skip(kind: Kind, body: Any) -> Skip | None:
    """Why this request cannot give an on-policy row, known from the request alone (None: it may)."""
    if not isinstance(body, dict):
        return Skip.BODY
    if _truthy(body, "use_beam_search"):
        return Skip.BEAM_SEARCH
    if body.get("n") not in (None, 1):
        return Skip.N
    if _truthy(body, "echo"):
        return Skip.ECHO
    if _truthy(body, "watermarking"):
        return Skip.WATERMARK
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return Skip.BODY
        if _truthy(body, "continue_final_message") or body.get("add_generation_prompt") is False:
            return Skip.PREFILL
        if not all(isinstance(m, dict) and _text_only(m.get("content")) for m in messages):
            return Skip.INPUT
        return None
    if body.get("prompt_embeds") is not None:
        return Skip.INPUT
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _token_ids(prompt):
        return None
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _token_ids(prompt[0])):
        return None
    return Skip.BATCH if isinstance(prompt, list) and len(prompt) > 1 else Skip.BODY


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


@dataclass(frozen=True)
class Asked:
    """What the capture added to a sampled request, so that the response loses exactly that again."""

    token_ids: bool  # return_token_ids was added: strip prompt_token_ids and token_ids
    usage: bool  # stream_options.include_usage was added: drop the final usage chunk
    logprobs: bool  # the client asked for logprobs (a chunk without text still reaches it then)


def ask(body: dict[str, Any], *, force_include_usage: bool) -> tuple[dict[str, Any], Asked]:
    """The request sent to the server in place of `body`: with the token ids asked for, and when streaming the
    usage chunk that carries the metrics (unless the client or the server already asks for them)."""
    out = dict(body)
    token_ids = not _truthy(body, "return_token_ids")
    if token_ids:
        out["return_token_ids"] = True
    usage = False
    if _truthy(body, "stream") and not force_include_usage:
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        if not options.get("include_usage"):
            usage = True
            # continuous usage needs include_usage: the client's flag had no effect without it, and keeps none
            options.update(include_usage=True, continuous_usage_stats=False)
            out["stream_options"] = options
    return out, Asked(token_ids=token_ids, usage=usage, logprobs=bool(body.get("logprobs")))


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys of objects included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def redaction_hit(patterns: Sequence[re.Pattern[str]], *values: Any) -> bool:
    """Whether any pattern matches any string in the values. A row whose text matches is not captured: its token
    ids hold the same text, and the pod has no tokenizer of its own to encode the redacted text again."""
    return bool(patterns) and any(p.search(s) for v in values for s in strings(v) for p in patterns)


def request_texts(kind: Kind, body: dict[str, Any]) -> list[Any]:
    """The parts of a request whose text reaches the row (the token ids hold them, rendered): all but `model`."""
    return [v for k, v in body.items() if k != "model"]


def prompt_is_ids(kind: Kind, body: dict[str, Any]) -> bool:
    """A completions prompt given as token ids: no redaction can read it."""
    prompt = body.get("prompt")
    first = prompt[0] if isinstance(prompt, list) and prompt else None
    return kind == "completion" and (_token_ids(prompt) or _token_ids(first))


def acceptance_of(metrics: Any) -> dict[str, Any] | None:
    """The row's `acceptance`: vLLM's per-request metrics.speculative_decoding, summary fields with fixed types (a
    shard's columns keep one type across rows); None when the response has none."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    try:
        out: dict[str, Any] = {k: float(spec[k]) for k in ACCEPTANCE_FLOATS}
        out.update({k: int(spec[k]) for k in ACCEPTANCE_INTS})
        out["acceptance_histogram"] = [int(v) for v in spec.get("acceptance_histogram") or []]
    except (KeyError, TypeError, ValueError):
        return None
    return out


def below_threshold(settings: CaptureSettings, acceptance: dict[str, Any]) -> bool:
    """Whether mode BelowThreshold keeps a request with this acceptance (mode All keeps every one)."""
    if settings.mode != "BelowThreshold":
        return True
    return bool(acceptance["draft_acceptance_rate"] < settings.effective_threshold)


@dataclass
class Completion:
    """The response of a sampled request as the capture reads it (non-streaming, or gathered from a stream)."""

    model: str | None = None
    prompt_ids: list[int] | None = None
    ids: list[int] | None = None
    text: dict[str, Any] | None = None  # chat: the assistant message; completions: {"text": ...}
    finish_reason: str | None = None
    metrics: Any = None
    error: bool = False


def response_skip(settings: CaptureSettings, done: Completion) -> Skip | None:
    """Why a response cannot give a row (None: it can), the redactions aside."""
    if done.error:
        return Skip.STATUS
    if done.model != settings.served_model:
        return Skip.ADAPTER
    if not done.prompt_ids or not done.ids:
        return Skip.TOKEN_IDS
    acceptance = acceptance_of(done.metrics)
    if acceptance is None:
        # with K 0 (speculation off) nothing is measured, and the verifier's own completions are still on-policy
        return None if settings.k == 0 and settings.mode == "All" else Skip.METRICS
    if not below_threshold(settings, acceptance):
        return Skip.THRESHOLD
    return None


def read_response(kind: Kind, body: dict[str, Any]) -> Completion:
    """A non-streaming response's parts."""
    choices = body.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    if kind == "chat":
        message = first.get("message") or {}
        text: dict[str, Any] = {
            "role": "assistant",
            "content": message.get("content"),
            "reasoning_content": message.get("reasoning"),  # prepare-data's name for vLLM's `reasoning`
            "tool_calls": message.get("tool_calls") or [],
        }
        prompt_ids = body.get("prompt_token_ids")
    else:
        text = {"text": first.get("text")}
        prompt_ids = first.get("prompt_token_ids")
    return Completion(
        model=body.get("model"),
        prompt_ids=prompt_ids if _token_ids(prompt_ids) else None,
        ids=first.get("token_ids") if _token_ids(first.get("token_ids")) else None,
        text=text,
        finish_reason=first.get("finish_reason"),
        metrics=body.get("metrics"),
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def build_row(
    kind: Kind, body: dict[str, Any], done: Completion, settings: CaptureSettings, *, row_id: str, captured_at: str
) -> dict[str, Any]:
    """One shard row: the exact tokens `speculators prepare-data` trains on as a pretokenized row (the prompt with
    loss 0, earlier assistant turns included, then the completion with loss 1), and the request, the completion and
    its acceptance for audit and filtering. Columns holding request or response structures are JSON text, so every
    row of every shard has the same columns with the same types (datasets loads shards side by side only so)."""
    assert done.prompt_ids is not None  # response_skip said so
    assert done.ids is not None
    acceptance = acceptance_of(done.metrics) or UNMEASURED
    return {
        "schemaVersion": CAPTURE_SHARD_VERSION,
        "id": row_id,
        "kind": kind,
        "input_ids": [*done.prompt_ids, *done.ids],
        "loss_mask": [0] * len(done.prompt_ids) + [1] * len(done.ids),
        "messages": _json(body.get("messages") if kind == "chat" else []),
        "prompt": _json(body.get("prompt") if kind == "completion" else None),
        "tools": _json(body.get("tools") or []),
        "sampling": _json({k: body[k] for k in SAMPLING_KEYS if k in body}),
        "completion": _json(done.text),
        "finishReason": done.finish_reason or "",
        "acceptance": acceptance,
        "servedRevision": settings.served_revision,
        "verifierRevision": settings.verifier_revision,
        "draftRevision": settings.draft_revision,
        "k": settings.k,
        "capturedAt": captured_at,
    }


def encode_row(row: dict[str, Any]) -> bytes:
    """The row as one jsonl line: UTF-8, or with ASCII escapes where the text holds what UTF-8 cannot (a lone
    surrogate the client escaped in its JSON)."""
    try:
        return (_json(row) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(row, separators=(",", ":")) + "\n").encode()


class Budget:
    """This pod's captures per clock hour (UTC): its share of the deployment's maxPerHour. A clock hour rather than a
    sliding one keeps the count in one integer, and the deployment's total per clock hour within the cap."""

    def __init__(self) -> None:
        self.hour = -1
        self.used = 0

    def _roll(self, now: float) -> None:
        hour = int(now // 3600)
        if hour != self.hour:
            self.hour, self.used = hour, 0

    def exhausted(self, now: float, limit: int) -> bool:
        self._roll(now)
        return self.used >= limit

    def take(self, now: float, limit: int) -> bool:
        """Count one capture at `now` (seconds since the epoch); False when the hour's `limit` is reached."""
        if self.exhausted(now, limit):
            return False
        self.used += 1
        return True
