"""The prior cost of a draft forward on a device class, before any sweep or live step time (docs/concepts/economics.md).

On a GPU a decode step is latency-bound: a forward costs a fixed time (kernel launches, norms, sampling, the
scheduler's bookkeeping) plus the time to read its weights, and only under load does its arithmetic count. A small
draft therefore costs far more than its share of the parameters: an EAGLE-3 head with 5.7 % of Llama-3.1-8B's
parameters costs some 13-15 % of its step on an H100. The prior prices one draft forward relative to one verifier
step at batch 1 as

    c = (τ_draft + bytes_draft / BW + positions · flops_draft / FLOPS) / (τ_step + bytes_verifier / BW)

with, per device class, BW the bandwidth a decode step reaches (85 % of the datasheet figure), FLOPS its dense BF16
rate, τ_step the fixed time of a verifier step beyond its weight reads and τ_draft that of one draft forward (the
per-step cost of speculation itself, verifying K + 1 tokens and the rejection sampler, folded in at K = 4). Bytes are
BF16 weights (two per parameter), split over the tensor-parallel ranks (vLLM shards the draft like its verifier). A
parallel drafter (P-EAGLE, DFlash, DSpark) runs one forward for all K tokens, so `positions` is K for it, 1 for a chain
drafter; a draft without an lm_head of its own reads the verifier's (DFlash family with the full vocabulary).

τ_step and τ_draft come from the public calibration rows in CALIBRATION (H100 and A100); the other classes take
their generation's τ with their own datasheet bandwidth. An unknown GPU gets the H100's coefficients; `cpu` keeps the
parameter ratio (a CPU forward is compute-bound: its cost follows the parameters it touches).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from speculator_operator.domain.algorithms import drafts_in_parallel
from speculator_operator.domain.economics import (
    DEFAULT_WORKLOAD,
    LoadModel,
    draft_active_parameters,
    verifier_active_parameters,
)

BYTES_PER_PARAMETER = 2  # BF16 weights
BANDWIDTH_EFFICIENCY = 0.85  # the share of the datasheet bandwidth a decode step's weight reads reach
# the share of the datasheet dense rate a decode batch's arithmetic reaches (GEMMs of a few hundred rows, the lm_head,
# norms and sampling per token): 0.56, from NVIDIA's published NIM sweep of Llama-3.3-70B-Instruct on 2 x H100 FP8
# (tests/unit/test_economics_prior.py re-derives it; docs/concepts/economics.md)
COMPUTE_EFFICIENCY = 0.56
# the context a request in flight holds when nothing says otherwise: the default workload's (economics.py, ShareGPT's
# mean lengths) prompt and half its answer, ~330 tokens, so that the KV reads and the prefill assume the same requests;
# its KV cache is read once per step
DEFAULT_CONTEXT_TOKENS = round(DEFAULT_WORKLOAD.mean_context)
KV_BYTES_PER_ELEMENT = 2  # BF16 KV cache
DEFAULT = "default"  # the prior used for a GPU this table does not know (or a deployment that does not say)
CPU = "cpu"


@dataclass(frozen=True)
class Device:
    """One device class's coefficients."""

    key: str
    datasheet_gbs: float  # HBM / GDDR bandwidth, GB/s (vendor datasheet)
    tflops: float  # dense BF16 TFLOP/s (vendor datasheet)
    step_ms: float  # τ_step: fixed time of a verifier step beyond its weight reads
    draft_ms: float  # τ_draft: fixed time of one draft forward, speculation's per-step overhead folded in at K = 4
    basis: str  # where τ comes from

    @property
    def bandwidth_gbs(self) -> float:
        return self.datasheet_gbs * BANDWIDTH_EFFICIENCY


# τ fitted on the calibration rows below (tests/unit/test_economics_prior.py re-derives them from the rows)
H100_STEP_MS, H100_DRAFT_MS = 2.23, 0.65
A100_STEP_MS, A100_DRAFT_MS = 0.78, 0.86

DEVICES: dict[str, Device] = {
    d.key: d
    for d in (
        Device("h100", 3350, 989, H100_STEP_MS, H100_DRAFT_MS, "calibrated (H100 rows)"),
        Device("h200", 4800, 989, H100_STEP_MS, H100_DRAFT_MS, "Hopper: the H100's τ, its own bandwidth"),
        Device("gh200", 4000, 989, H100_STEP_MS, H100_DRAFT_MS, "Hopper: the H100's τ, its own bandwidth"),
        Device("b200", 8000, 2250, H100_STEP_MS, H100_DRAFT_MS, "no public row: the H100's τ, its own bandwidth"),
        Device("b300", 8000, 2250, H100_STEP_MS, H100_DRAFT_MS, "no public row: the H100's τ, its own bandwidth"),
        Device("a100-40gb", 1555, 312, A100_STEP_MS, A100_DRAFT_MS, "calibrated (A100 40GB rows)"),
        Device("a100", 2039, 312, A100_STEP_MS, A100_DRAFT_MS, "Ampere: the A100 40GB's τ, its own bandwidth"),
        Device("a10", 600, 125, A100_STEP_MS, A100_DRAFT_MS, "Ampere: the A100's τ, its own bandwidth"),
        Device("l40s", 864, 362, A100_STEP_MS, A100_DRAFT_MS, "Ada: the A100's τ, its own bandwidth"),
        Device("l4", 300, 121, A100_STEP_MS, A100_DRAFT_MS, "Ada: the A100's τ, its own bandwidth"),
    )
}
DEVICES[DEFAULT] = Device(DEFAULT, 3350, 989, H100_STEP_MS, H100_DRAFT_MS, "an unknown GPU: the H100's coefficients")

# GPU names (CUDA's or GPU feature discovery's, normalized by domain.sweep.device_class) to a row above: the first
# pattern that matches a whole dash-separated word wins, so `a100` never matches `a10`, nor `h100` `gh200`.
_NAMES: tuple[tuple[str, str], ...] = (
    (r"gh200", "gh200"),
    (r"h200", "h200"),
    (r"h100|h800", "h100"),
    (r"g?b300", "b300"),
    (r"g?b200", "b200"),
    (r"a100|a800", "a100"),
    (r"a10g?", "a10"),
    (r"l40s|l40", "l40s"),
    (r"l4", "l4"),
)


def prior_key(device: str | None) -> str:
    """The prior row for a device class (`nvidia-h100-80gb-hbm3`, `cpu`, …): `default` where it is not known."""
    if not device:
        return DEFAULT
    if device == CPU:
        return CPU
    words = device.split("-")
    for pattern, key in _NAMES:
        if any(re.fullmatch(pattern, w) for w in words):
            if key == "a100" and "40gb" in words:
                return "a100-40gb"
            return key
    return DEFAULT


@dataclass(frozen=True)
class PairSize:
    """What a draft forward and a verifier step read: parameters per token."""

    draft: int  # the draft's own tensors (frozen embeddings and vocabulary maps excluded)
    shared_head: int  # the verifier's lm_head, read by a draft that has none of its own (0 otherwise)
    verifier: int  # the verifier's parameters touched per token (attention, MLP or routed experts, lm_head)
    kv_bytes: int | None = None  # the KV bytes one token of context holds in the verifier (None: its config says not)
    draft_kv_bytes: int = 0  # and in the draft

    @property
    def draft_total(self) -> int:
        return self.draft + self.shared_head

    @property
    def parameter_ratio(self) -> float:
        return self.draft_total / self.verifier


def pair_size(draft_shapes: Mapping[str, tuple[int, ...]], verifier_config: Mapping[str, object]) -> PairSize | None:
    """The pair's sizes from the draft's header and the verifier's config; None where the config does not say enough."""
    try:
        verifier = verifier_active_parameters(verifier_config)
    except ValueError:
        return None
    if verifier <= 0:
        return None
    shared = 0
    if not any(n == "lm_head.weight" or n.endswith(".lm_head.weight") for n in draft_shapes):
        text = verifier_config.get("text_config")
        cfg: Mapping[str, object] = text if isinstance(text, Mapping) else verifier_config
        hidden, vocab = cfg.get("hidden_size"), cfg.get("vocab_size")
        if isinstance(hidden, int) and isinstance(vocab, int):
            shared = hidden * vocab
    return PairSize(
        draft=draft_active_parameters(draft_shapes),
        shared_head=shared,
        verifier=verifier,
        kv_bytes=kv_bytes_per_token(verifier_config),
        draft_kv_bytes=draft_kv_bytes_per_token(draft_shapes),
    )


@dataclass(frozen=True)
class Prior:
    key: str  # the DEVICES row, or `cpu`
    cost_ratio: float  # c
    draft_ms: float | None  # the modelled draft forward and verifier step (None on a CPU)
    step_ms: float | None


def kv_bytes_per_token(config: Mapping[str, object]) -> int | None:
    """The KV cache bytes one token of context holds in the verifier (K and V, every layer, BF16); None where the
    config does not say."""
    text = config.get("text_config")
    cfg: Mapping[str, object] = text if isinstance(text, Mapping) else config
    layers, heads, hidden = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads"), cfg.get("hidden_size")
    kv_heads, head_dim = cfg.get("num_key_value_heads", heads), cfg.get("head_dim")
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0 and isinstance(kv_heads, int)):
        return None
    if not isinstance(head_dim, int):
        if not isinstance(hidden, int):
            return None
        head_dim = hidden // heads
    return 2 * layers * kv_heads * head_dim * KV_BYTES_PER_ELEMENT


def draft_kv_bytes_per_token(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The KV cache bytes one token of context holds in the draft: K and V of every k_proj it has (BF16)."""
    return sum(2 * shape[0] * KV_BYTES_PER_ELEMENT for name, shape in shapes.items() if name.endswith("k_proj.weight"))


def load_model(
    size: PairSize,
    device: str | None,
    kv_bytes: int | None,
    draft_kv_bytes: int = 0,
    tensor_parallel: int = 1,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> LoadModel | None:
    """How the pair's steps grow with the requests in flight on `device` (None on a CPU: the saturation model stays).

    verifier step(T tokens, B requests) = τ_step + bytes_verifier/BW + T·2·P_verifier/(FLOPS·η) + B·L·kv/BW, the draft's
    likewise with τ_draft; L the context in flight (DEFAULT_CONTEXT_TOKENS unless said), kv the KV bytes a token holds.
    """
    key = prior_key(device)
    if key == CPU:
        return None
    d = DEVICES[key]
    tp = max(1, tensor_parallel)
    bw = d.bandwidth_gbs * 1e9
    flops = d.tflops * 1e12 * COMPUTE_EFFICIENCY

    def token_ms(parameters: float) -> float:
        return 1e3 * 2 * parameters / tp / flops

    def weights_ms(parameters: float) -> float:
        return 1e3 * BYTES_PER_PARAMETER * parameters / tp / bw

    def kv_ms(per_token: int | None) -> float:
        return 1e3 * max(0, context_tokens) * (per_token or 0) / tp / bw

    return LoadModel(
        verifier_fixed_ms=d.step_ms + weights_ms(size.verifier),
        verifier_token_ms=token_ms(size.verifier),
        verifier_request_ms=kv_ms(kv_bytes),
        draft_fixed_ms=d.draft_ms + weights_ms(size.draft_total),
        draft_token_ms=token_ms(size.draft_total),
        draft_request_ms=kv_ms(draft_kv_bytes),
    )


def pair_load(size: PairSize, device: str | None, tensor_parallel: int = 1) -> LoadModel | None:
    """The pair's load model on `device` from the KV bytes its sizes carry (None on a CPU: the saturation model)."""
    return load_model(size, device, size.kv_bytes, size.draft_kv_bytes, tensor_parallel)


def forward_ms(parameters: float, device: Device, tensor_parallel: int = 1, positions: int = 1) -> float:
    """The modelled time of one forward's weight reads and arithmetic (without its fixed overhead)."""
    tp = max(1, tensor_parallel)
    read = BYTES_PER_PARAMETER * parameters / tp / (device.bandwidth_gbs * 1e9)
    compute = 2 * parameters * positions / tp / (device.tflops * 1e12)
    return 1e3 * (read + compute)


def prior(size: PairSize, device: str | None, algorithm: str, k: int, tensor_parallel: int = 1) -> Prior:
    """The prior draft/verifier cost ratio of `size` on `device` (a device class, None: not known) with K tokens."""
    key = prior_key(device)
    if key == CPU:
        return Prior(CPU, size.parameter_ratio, None, None)
    d = DEVICES[key]
    positions = max(1, k) if drafts_in_parallel(algorithm) else 1
    draft_ms = d.draft_ms + forward_ms(size.draft_total, d, tensor_parallel, positions)
    step_ms = d.step_ms + forward_ms(size.verifier, d, tensor_parallel)
    return Prior(key, draft_ms / step_ms, draft_ms, step_ms)


def implied_cost_ratio(mean_length: float, speedup: float, forwards: int) -> float:
    """The cost ratio a measured row implies: a step costs mean_length / speedup plain steps = 1 + n·c."""
    if forwards < 1 or speedup <= 0 or math.isnan(speedup):
        raise ValueError("a row needs forwards >= 1 and a positive speedup")
    return (mean_length / speedup - 1.0) / forwards
