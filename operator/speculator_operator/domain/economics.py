"""The economics of speculation: when does a draft pay for itself, with which K, up to which batch size.

Model (the standard one for greedy chain speculation with per-token acceptance probability α):
- a verification step with K drafted tokens yields E(α, K) = (1 − α^(K+1)) / (1 − α) tokens
  on average (E = K + 1 at α = 1);
- it costs one target forward plus the draft forwards: 1 + n·c, where c is the draft/target cost
  ratio and n the number of draft forwards per step (K for autoregressive EAGLE-3, 1 for the
  parallel drafters P-EAGLE, DFlash and DSpark);
- speedup = E / (1 + n·c); the break-even α* solves speedup = 1.

At larger batch sizes the target forward stops being memory-bound: verifying K extra tokens per
request then costs real compute. `cutoff_schedule` models that with a device class `LoadModel` (a step
that grows with its tokens' arithmetic and its requests' KV reads from the first request on, and carries the
prefill of the prompts that replace finished requests: a `Workload`, E(α, K) times as much for a speculating
server as for plain decoding) or, without one, a saturation point (tokens per step beyond which the target's
step time grows linearly), and turns the best K per batch size into vLLM's
`num_speculative_tokens_per_batch_size` triples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from speculator_operator.domain.algorithms import Algorithm, drafts_in_parallel


def _check_alpha(alpha: float) -> None:
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise ValueError(f"acceptance rate must be in [0, 1], got {alpha}")


def _check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")


def expected_tokens(alpha: float, k: int) -> float:
    """E(α, K): expected tokens emitted per verification step (accepted drafts + the bonus token)."""
    _check_alpha(alpha)
    _check_k(k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def draft_forwards(algorithm: str, k: int) -> int:
    """Draft forward passes per verification step."""
    if k == 0:
        return 0
    return 1 if drafts_in_parallel(algorithm) else k


def speedup(alpha: float, k: int, cost_ratio: float, forwards: int | None = None) -> float:
    """E(α, K) / (1 + n·c), with n = K unless given (see draft_forwards)."""
    if cost_ratio < 0:
        raise ValueError(f"cost ratio must be >= 0, got {cost_ratio}")
    n = k if forwards is None else forwards
    return expected_tokens(alpha, k) / (1.0 + n * cost_ratio)


def break_even_alpha(k: int, cost_ratio: float, forwards: int | None = None) -> float | None:
    """The acceptance rate at which speculation neither helps nor hurts; None if it never pays."""
    _check_k(k)
    if k == 0:
        return None
    n = k if forwards is None else forwards
    target = 1.0 + n * cost_ratio
    if target >= k + 1:  # even perfect acceptance cannot pay for the drafts
        return None
    return _alpha_where_expected_tokens_is(target, k)


def _alpha_where_expected_tokens_is(tokens: float, k: int) -> float:
    """The α in [0, 1] with E(α, K) = tokens (1 < tokens < K + 1): E is increasing in α, so bisect."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def alpha_from_mean_length(mean_length: float, k: int) -> float:
    """The per-position acceptance α whose E(α, K) equals a measured mean accepted length (1 + accepted
    drafts per verification step, the bonus token included). The raw rate accepted/drafted is not α: at
    α = 0.2, K = 3 it is ≈ 0.083."""
    _check_k(k)
    if k == 0:
        raise ValueError("K must be >= 1 to estimate acceptance")
    if mean_length <= 1.0:
        return 0.0
    if mean_length >= k + 1:
        return 1.0
    return _alpha_where_expected_tokens_is(mean_length, k)


def best_k(
    alpha: float, cost_ratio: float, algorithm: str = Algorithm.EAGLE3.value, k_max: int = 16
) -> tuple[int, float]:
    """The K in 0..k_max with the highest speedup for a measured α (K = 0: do not speculate)."""
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = speedup(alpha, k, cost_ratio, draft_forwards(algorithm, k))
        if s > best[1] + 1e-12:
            best = (k, s)
    return best


# ------------------------------------------------------------------ cost ratio from parameter counts

FROZEN_OR_MAPS = ("embed_tokens.weight", "t2d", "d2t", "verifier_lm_head.weight", "verifier_norm.weight")


def draft_active_parameters(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Parameters a draft forward touches: all tensors but frozen embeddings and vocab maps."""
    total = 0
    for name, shape in shapes.items():
        if name.endswith(FROZEN_OR_MAPS):
            continue
        total += math.prod(shape)
    return total


def verifier_active_parameters(config: Mapping[str, object]) -> int:
    """Parameters a verifier forward touches per token, estimated from its HF config.

    Attention (q, k, v, o) + MLP (gate, up, down; for MoE the routed experts a token uses plus any
    shared expert) per layer, plus the LM head. Embeddings are a lookup and are not counted.
    """
    text = config.get("text_config")
    cfg: Mapping[str, object] = text if isinstance(text, Mapping) else config

    def num(key: str, default: int | None = None) -> int:
        value = cfg.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"verifier config: {key} must be a non-negative integer, got {value!r}")
        return value

    hidden = num("hidden_size")
    layers = num("num_hidden_layers")
    heads = num("num_attention_heads")
    kv_heads = num("num_key_value_heads", heads)
    head_dim = num("head_dim", hidden // heads if heads else 0)
    vocab = num("vocab_size")
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    experts_per_token = cfg.get("num_experts_per_tok")
    if isinstance(experts_per_token, int) and experts_per_token > 0 and cfg.get("moe_intermediate_size"):
        moe = num("moe_intermediate_size")
        shared = cfg.get("shared_expert_intermediate_size") or 0
        mlp = 3 * hidden * (moe * experts_per_token + (shared if isinstance(shared, int) else 0))
    else:
        mlp = 3 * hidden * num("intermediate_size")
    return layers * (attention + mlp) + vocab * hidden


def cost_ratio(draft_shapes: Mapping[str, tuple[int, ...]], verifier_params: int) -> float:
    if verifier_params <= 0:
        raise ValueError("verifier parameter count must be positive")
    return draft_active_parameters(draft_shapes) / verifier_params


def pair_cost_ratio(draft_shapes: Mapping[str, tuple[int, ...]], verifier_config: Mapping[str, object]) -> float | None:
    """The draft/verifier cost ratio of a pair, or None when the verifier's config does not say enough."""
    try:
        return cost_ratio(draft_shapes, verifier_active_parameters(verifier_config))
    except ValueError:
        return None


# ------------------------------------------------------------------ the load cut-off


@dataclass(frozen=True)
class Schedule:
    """vLLM's `num_speculative_tokens_per_batch_size`: inclusive [start, end, K] ranges from 1."""

    ranges: tuple[tuple[int, int, int], ...]

    def as_list(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]

    def k_at(self, batch_size: int) -> int:
        for start, end, k in self.ranges:
            if start <= batch_size <= end:
                return k
        return self.ranges[-1][2]


def schedule_from_cutoff(k: int, max_batch_size: int, max_num_seqs: int) -> Schedule:
    """K up to `max_batch_size` concurrent requests, no speculation above it."""
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    if max_batch_size < 1 or max_num_seqs < 1:
        raise ValueError("batch sizes must be >= 1")
    if max_batch_size >= max_num_seqs:
        return Schedule(((1, max_num_seqs, k),))
    return Schedule(((1, max_batch_size, k), (max_batch_size + 1, max_num_seqs, 0)))


@dataclass(frozen=True)
class LoadModel:
    """How a verifier step and a draft forward grow with the requests in flight on one device class (milliseconds):
    a fixed part (launches, weight reads), a part per token in the batch (its arithmetic at the class's decode
    efficiency) and a part per request (reading its KV cache over the context in flight). domain/priors.py builds
    one from the pair's sizes and the device class; docs/concepts/economics.md gives the coefficients."""

    verifier_fixed_ms: float
    verifier_token_ms: float
    verifier_request_ms: float
    draft_fixed_ms: float
    draft_token_ms: float
    draft_request_ms: float

    def verifier(self, batch_size: int, tokens_per_request: int) -> float:
        return self.verifier_fixed_ms + batch_size * (
            tokens_per_request * self.verifier_token_ms + self.verifier_request_ms
        )

    def draft(self, batch_size: int, positions: int) -> float:
        """One draft forward over `positions` tokens a request (K + 1 for a parallel drafter's block, 1 for a chain)."""
        return self.draft_fixed_ms + batch_size * (positions * self.draft_token_ms + self.draft_request_ms)


@dataclass(frozen=True)
class Workload:
    """The requests a server runs, on average: prompt and answer tokens. Under a closed loop (a fixed number of
    requests in flight, each replaced when it finishes) a request that generates g tokens a step finishes g/output
    times a step, and its successor's prompt is prefilled in the same steps (vLLM's chunked prefill): B·g·prompt/output
    prompt tokens a step, g = 1 for plain decoding and E(α, K) for a speculating server, which therefore prefills E
    times as much per step as plain decoding does."""

    prompt_tokens: float
    output_tokens: float

    @property
    def prompt_per_output(self) -> float:
        """Prompt tokens prefilled per token generated."""
        return self.prompt_tokens / self.output_tokens if self.output_tokens > 0 else 0.0

    @property
    def mean_context(self) -> float:
        """The context a request in flight holds on average over its decode: its prompt and half its answer."""
        return self.prompt_tokens + self.output_tokens / 2


# The workload when nothing says otherwise: ShareGPT's mean input and output lengths (161.31 and 337.99 tokens), the
# chat dataset vLLM's serving benchmarks replay (Kwon et al., "Efficient Memory Management for Large Language Model
# Serving with PagedAttention", SOSP 2023, arXiv 2309.06180, section 6.1 and figure 11). A deployment's own figures
# (vllm:prompt_tokens_total against vllm:generation_tokens_total over a window) would replace it: cutoff_schedule's
# `workload`; the status records none of them today.
SHAREGPT = Workload(161.31, 337.99)
DEFAULT_WORKLOAD = SHAREGPT


def _prefill_tokens(batch_size: int, generated: float, workload: Workload | None) -> float:
    """Prompt tokens a step prefills at `batch_size` requests in flight, each generating `generated` tokens a step."""
    return 0.0 if workload is None else batch_size * generated * workload.prompt_per_output


def speculative_step(
    load: LoadModel,
    batch_size: int,
    k: int,
    cost_ratio: float,
    algorithm: str = Algorithm.EAGLE3.value,
    *,
    generated: float,
    workload: Workload | None = DEFAULT_WORKLOAD,
) -> float:
    """A speculative step's time at `batch_size`, in plain batch-1 steps: the verifier over K + 1 tokens a request
    plus the draft forwards, and the prompts of the requests that replace finished ones (`generated`: E(α, K), the
    tokens a request gains a step; the verifier and the draft both run over a prompt, at their per-token arithmetic).
    `cost_ratio` (the sweep's, the live one or the prior's) prices the draft at batch 1; the load model only says how
    that grows with the batch, so a measured c keeps its precedence. `workload` None leaves the prefill out."""
    base = _plain_ms(load, 1, workload)
    n = draft_forwards(algorithm, k)
    positions = k + 1 if drafts_in_parallel(algorithm) else 1  # a parallel drafter's block: the anchor and K masks
    prefill = _prefill_tokens(batch_size, generated, workload)
    verifier = load.verifier(batch_size, 1 + k) + prefill * load.verifier_token_ms
    # the draft's K forwards (or one), and once a step its pass over the prompt tokens (it keeps its own KV cache)
    grown = n * load.draft(batch_size, positions) + prefill * load.draft_token_ms
    draft = cost_ratio * load.verifier(1, 1) * grown / load.draft(1, positions) if n else 0.0
    return (verifier + draft) / base


def _plain_ms(load: LoadModel, batch_size: int, workload: Workload | None) -> float:
    return load.verifier(batch_size, 1) + _prefill_tokens(batch_size, 1.0, workload) * load.verifier_token_ms


def plain_step(load: LoadModel, batch_size: int, workload: Workload | None = DEFAULT_WORKLOAD) -> float:
    """A plain step's time at `batch_size`, in plain batch-1 steps (its prefill included: one token a request a step
    brings prompt/output prompt tokens)."""
    return _plain_ms(load, batch_size, workload) / _plain_ms(load, 1, workload)


def step_cost(batch_size: int, tokens_per_request: int, saturation_tokens: int) -> float:
    """Relative target step time: flat while memory-bound, linear in tokens beyond saturation."""
    return max(1.0, batch_size * tokens_per_request / saturation_tokens)


def cutoff_schedule(
    alpha: float,
    cost_ratio: float,
    k_max: int,
    max_num_seqs: int,
    saturation_tokens: int = 256,
    algorithm: str = Algorithm.EAGLE3.value,
    load: LoadModel | None = None,
    workload: Workload | None = DEFAULT_WORKLOAD,
) -> Schedule:
    """The best K for every batch size 1..max_num_seqs, compressed into ranges.

    Throughput at batch b with K: b·E(α, K) / spec(b, K) against b / plain(b) without speculation; K = 0 wherever
    nothing beats plain decoding. With a device class `load` model, spec and plain are speculative_step and
    plain_step (steps that grow from the first request on, the prompts that replace finished requests prefilled in
    them: `workload`'s prompt/output tokens, ShareGPT's unless the caller knows the deployment's); without one (a CPU,
    or no pair sizes), the verifier's step is flat up to `saturation_tokens` and linear beyond: spec =
    step_cost(b, 1+K) + n·c·step_cost(b, 1)."""
    if k_max < 1 or max_num_seqs < 1 or saturation_tokens < 1:
        raise ValueError("k_max, max_num_seqs and saturation_tokens must be >= 1")
    ranges: list[list[int]] = []
    for b in range(1, max_num_seqs + 1):
        plain = 1.0 / (plain_step(load, b, workload) if load else step_cost(b, 1, saturation_tokens))
        best_k_here, best_rate = 0, plain
        for k in range(1, k_max + 1):
            if load is not None:
                generated = expected_tokens(alpha, k)
                cost = speculative_step(load, b, k, cost_ratio, algorithm, generated=generated, workload=workload)
            else:
                n = draft_forwards(algorithm, k)
                cost = step_cost(b, 1 + k, saturation_tokens) + n * cost_ratio * step_cost(b, 1, saturation_tokens)
            rate = expected_tokens(alpha, k) / cost
            if rate > best_rate * (1 + 1e-9):
                best_k_here, best_rate = k, rate
        if ranges and ranges[-1][2] == best_k_here:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, best_k_here])
    return Schedule(tuple((s, e, k) for s, e, k in ranges))
