"""The device class prior (domain/priors.py): its coefficients re-derived from the public calibration rows, and the
held-out check against the two sources that judge it and were not used to fit it (docs/concepts/economics.md).

A row's implied cost: a step costs mean_length / speedup plain steps = 1 + n·c. Every figure below is copied from the
cited public page; nothing here was measured by this project."""

from __future__ import annotations

import pytest

from speculator_operator.domain.economics import (
    DEFAULT_WORKLOAD,
    SHAREGPT,
    LoadModel,
    Workload,
    alpha_from_mean_length,
    cutoff_schedule,
    expected_tokens,
    plain_step,
    speculative_step,
    speedup,
    step_cost,
    verifier_active_parameters,
)
from speculator_operator.domain.priors import (
    BANDWIDTH_EFFICIENCY,
    COMPUTE_EFFICIENCY,
    DEFAULT,
    DEVICES,
    PairSize,
    draft_kv_bytes_per_token,
    forward_ms,
    implied_cost_ratio,
    kv_bytes_per_token,
    load_model,
    pair_size,
    prior,
    prior_key,
)
from speculator_operator.domain.sweep import device_class

# ------------------------------------------------------------------ the pairs, from their public configs


def llama_layer(i: int, hidden: int, inner: int, kv: int, q_in: int | None = None) -> dict[str, tuple[int, ...]]:
    q_in = q_in or hidden
    p = f"layers.{i}."
    return {
        p + "self_attn.q_proj.weight": (hidden, q_in),
        p + "self_attn.k_proj.weight": (kv, q_in),
        p + "self_attn.v_proj.weight": (kv, q_in),
        p + "self_attn.o_proj.weight": (hidden, hidden),
        p + "mlp.gate_proj.weight": (inner, hidden),
        p + "mlp.up_proj.weight": (inner, hidden),
        p + "mlp.down_proj.weight": (hidden, inner),
    }


# meta-llama/Llama-3.1-8B-Instruct (Llama-3-8B has the same shapes)
LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256}  # fmt: skip
# an EAGLE-1 head for it (yuhuili/EAGLE-LLaMA3.1-Instruct-8B, lmsys/sglang-EAGLE-LLaMA3-Instruct-8B): fc [H, 2H] and one
# decoder layer; it reads the verifier's lm_head
EAGLE1_8B = {"fc.weight": (4096, 8192), **llama_layer(0, 4096, 14336, 1024), "embed_tokens.weight": (128256, 4096)}
# the same head with fr-spec's pruned lm_head (a quarter of the vocabulary kept)
EAGLE1_8B_FRSPEC = {**EAGLE1_8B, "lm_head.weight": (32064, 4096)}
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: fc [H, 3H], attention over [embedding, hidden] (2H), a 32k draft vocabulary
EAGLE3_8B = {"fc.weight": (4096, 12288), **llama_layer(0, 4096, 14336, 1024, q_in=8192),
             "lm_head.weight": (32000, 4096), "embed_tokens.weight": (128256, 4096), "d2t": (32000,),
             "t2d": (128256,)}  # fmt: skip
# a ~27B dense Qwen verifier (the held-out row's Qwen3.8-27B publishes no config here: an approximation with 26.6B
# parameters a token touches) and a DSpark draft for it at the speculators defaults: five verifier-shaped layers,
# fc over five aux layers, the Markov head at rank 256, no lm_head of its own (full vocabulary)
QWEN_27B = {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 48, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 21504, "vocab_size": 151936}  # fmt: skip
DSPARK_27B = {
    "fc.weight": (5120, 5 * 5120),
    "markov_head.markov_w1": (151936, 256),
    "markov_head.markov_w2": (151936, 256),
    **{k: v for i in range(5) for k, v in llama_layer(i, 5120, 21504, 1024, q_in=5120).items()},
}
for _i in range(5):  # 48 heads of 128: q and o are 6144 wide
    DSPARK_27B[f"layers.{_i}.self_attn.q_proj.weight"] = (6144, 5120)
    DSPARK_27B[f"layers.{_i}.self_attn.o_proj.weight"] = (5120, 6144)


def size(draft: dict[str, tuple[int, ...]], verifier: dict[str, object]) -> PairSize:
    s = pair_size(draft, verifier)
    assert s is not None
    return s


# ------------------------------------------------------------------ the calibration rows (what the table is fitted on)

# H100, vLLM V1, batch 1, MT-Bench: Llama-3.1-8B-Instruct plain decoding at 133 tok/s (TPOT 7.5 ms).
# https://github.com/vllm-project/vllm/pull/16937#issuecomment-2828889840 and
# https://github.com/vllm-project/vllm/pull/17202 ("The TPOT of llama 3.1 is 7.5 which matches 133 tokens/s")
H100_PLAIN_TOK_S = 133.0
# vLLM V1, batch 1, MT-Bench, Llama-3-8B-Instruct with the lmsys EAGLE-1 head, the same author's series as the row above
# (tracking issue https://github.com/vllm-project/vllm/issues/17812); plain 128.64 tok/s.
# https://github.com/vllm-project/vllm/pull/16035#issuecomment-2790985075: (K, mean accepted length, tok/s)
H100_EAGLE1 = (128.64, [(2, 1.89, 175.49), (4, 2.08, 165.65)])
# A100 40GB, vLLM V1, batch 1, MT-Bench, Llama-3.1-8B-Instruct with the EAGLE-1 head and fr-spec's pruned lm_head:
# K=1 at 108.45 tok/s, 32.11 % faster than plain; K=32 at 48.32 tok/s.
# https://github.com/vllm-project/vllm/pull/24343 (comment of 2025-09-14)
A100_PLAIN_TOK_S = 108.45 / 1.3211
A100_FRSPEC = [(1, 1.63, 108.45), (32, 2.18, 48.32)]


def test_the_h100_coefficients_come_from_its_rows() -> None:
    h100 = DEVICES["h100"]
    verifier = verifier_active_parameters(LLAMA_8B)
    # τ_step: the plain step beyond its weight reads
    assert h100.step_ms == pytest.approx(1000 / H100_PLAIN_TOK_S - forward_ms(verifier, h100), abs=0.01)
    # τ_draft: the draft forward the K = 4 row implies, beyond its weight reads (the K = 2 row costs more per forward:
    # speculation's own per-step cost, spread over fewer drafts)
    plain, rows = H100_EAGLE1
    c = {k: implied_cost_ratio(length, tok_s / plain, k) for k, length, tok_s in rows}
    assert c[2] > c[4] == pytest.approx(0.154, abs=1e-3)
    draft = size(EAGLE1_8B, LLAMA_8B).draft_total
    assert h100.draft_ms == pytest.approx(c[4] * 1000 / plain - forward_ms(draft, h100), abs=0.01)
    # and the prior gives the rows back: within 25 % of each
    p = prior(size(EAGLE1_8B, LLAMA_8B), "nvidia-h100-80gb-hbm3", "eagle3", 4)
    for k, length, tok_s in rows:
        measured = tok_s / plain
        predicted = speedup(alpha_from_mean_length(length, k), k, p.cost_ratio)
        assert predicted == pytest.approx(measured, rel=0.25), (k, predicted, measured)


def test_the_a100_coefficients_come_from_its_rows() -> None:
    a100 = DEVICES["a100-40gb"]
    verifier = verifier_active_parameters(LLAMA_8B)
    assert a100.step_ms == pytest.approx(1000 / A100_PLAIN_TOK_S - forward_ms(verifier, a100), abs=0.01)
    # two K far apart: a step costs 1 + s + K·c_f plain steps; the prior's c is c_f + s/4 (K = 4)
    (k1, *_), (k2, *_) = A100_FRSPEC
    c1, c2 = (implied_cost_ratio(length, tok_s / A100_PLAIN_TOK_S, k) for k, length, tok_s in A100_FRSPEC)
    per_forward = (k2 * c2 - k1 * c1) / (k2 - k1)
    per_step = k1 * c1 - k1 * per_forward
    assert per_step == pytest.approx(0.154, abs=2e-3)  # the H100 rows give 0.156 the same way
    at_k4 = per_forward + per_step / 4
    draft = size(EAGLE1_8B_FRSPEC, LLAMA_8B).draft_total
    assert a100.draft_ms == pytest.approx(at_k4 * 1000 / A100_PLAIN_TOK_S - forward_ms(draft, a100), abs=0.01)


# ------------------------------------------------------------------ held-out: the two judging sources, never fitted on

# HELD OUT. vLLM issue #20780 (https://github.com/vllm-project/vllm/issues/20780): H100, batch 1, Llama-3.1-8B-Instruct
# with yuhuili/EAGLE3-LLaMA3.1-Instruct-8B; plain TPOT 7.07 ms; (K, mean accepted length, TPOT ms). Measured best K: 4.
HELD_OUT_EAGLE3 = [(2, 2.36, 4.32), (3, 2.79, 4.09), (4, 3.08, 4.05), (5, 3.32, 4.13), (6, 3.46, 4.20), (7, 3.54, 4.29)]
HELD_OUT_EAGLE3_PLAIN_MS = 7.07
# HELD OUT. The speculators repository's DSpark evaluation (examples/evaluate/results/qwen3_8_27b_dspark/README.md):
# one B200 per server, Qwen3.8-27B with RedHatAI/Qwen3.8-27B-speculator.dspark, 7 draft tokens; per dataset the mean
# accepted length and the throughput gain over plain decoding at 1, 2, 4 … 128 requests in flight. Plain decoding is
# faster from somewhere in (64, 128].
HELD_OUT_DSPARK = {
    "HumanEval": (3.40, [2.70, 2.65, 2.63, 2.42, 2.08, 1.59, 1.10, 0.74]),
    "math_reasoning": (4.59, [3.64, 3.44, 3.28, 3.01, 2.61, 1.99, 1.36, 0.95]),
}
IN_FLIGHT = [1, 2, 4, 8, 16, 32, 64, 128]


def held_out_eagle3(cost: float) -> list[tuple[int, float, float]]:
    """(K, predicted speedup, measured speedup) with the α each K's measured acceptance implies."""
    return [
        (k, speedup(alpha_from_mean_length(length, k), k, cost), HELD_OUT_EAGLE3_PLAIN_MS / tpot)
        for k, length, tpot in HELD_OUT_EAGLE3
    ]


def test_held_out_eagle3_on_an_h100_batch_1() -> None:
    p = prior(size(EAGLE3_8B, LLAMA_8B), device_class("NVIDIA H100 80GB HBM3"), "eagle3", 3)
    assert (p.key, round(p.cost_ratio, 3)) == ("h100", 0.126)
    rows = held_out_eagle3(p.cost_ratio)
    worst = max(abs(pred / meas - 1) for _, pred, meas in rows)
    assert worst < 0.25  # the target; 0.19 at the prior's c
    best_predicted = max(rows, key=lambda r: r[1])[0]
    best_measured = max(rows, key=lambda r: r[2])[0]
    assert best_measured == 4
    assert abs(best_predicted - best_measured) <= 1  # the target; the prior picks 4
    # the parameter ratio this replaces misses both targets on the same rows
    old = held_out_eagle3(size(EAGLE3_8B, LLAMA_8B).draft / size(EAGLE3_8B, LLAMA_8B).verifier)
    assert max(abs(pred / meas - 1) for _, pred, meas in old) > 0.25


def dspark_prior() -> float:
    return prior(size(DSPARK_27B, QWEN_27B), device_class("NVIDIA B200"), "dspark", 7).cost_ratio


def throughput_gain(alpha: float, k: int, cost: float, batch: int, saturation: int = 256) -> float:
    """cutoff_schedule's throughput with K at every batch size over plain decoding's (one parallel draft forward)."""
    spec = expected_tokens(alpha, k) / (step_cost(batch, 1 + k, saturation) + cost * step_cost(batch, 1, saturation))
    return spec * step_cost(batch, 1, saturation)


def test_held_out_dspark_at_batch_1_on_a_b200() -> None:
    c = dspark_prior()
    assert 0.13 < c < 0.2  # the measured rows imply 0.19 (HumanEval) and 0.14 (math_reasoning)
    for length, gains in HELD_OUT_DSPARK.values():
        predicted = throughput_gain(alpha_from_mean_length(length, 7), 7, c, 1)
        assert predicted == pytest.approx(gains[0], rel=0.25)


def dspark_load(context: int | None = None) -> LoadModel:
    kw = {} if context is None else {"context_tokens": context}
    m = load_model(size(DSPARK_27B, QWEN_27B), device_class("NVIDIA B200"), kv_bytes_per_token(QWEN_27B),
                   draft_kv_bytes_per_token(DSPARK_27B), **kw)  # fmt: skip
    assert m is not None
    return m


def load_gain(
    alpha: float, cost: float, load: LoadModel, batch: int, workload: Workload | None = DEFAULT_WORKLOAD
) -> float:
    """The load model's throughput with K = 7 over plain decoding's at `batch` requests in flight (the prompts that
    replace finished requests prefilled at `workload`'s prompt/output ratio, ShareGPT's by default)."""
    e = expected_tokens(alpha, 7)
    spec = speculative_step(load, batch, 7, cost, "dspark", generated=e, workload=workload)
    return e * plain_step(load, batch, workload) / spec


# The points the under-load target is judged on: every measured point from 2 to 64 in flight. 128 is left to the
# crossover check: the source's own validation flags its speculator points at 128 as queueing inside the server
# (median TTFT 11.0 s and 3.4 s), a capacity limit no step-time model describes, so only the sign of the gain there
# (the crossover interval) is held against the model.
UNDER_LOAD = [2, 4, 8, 16, 32, 64]


def held_out_dspark_under_load(load: LoadModel) -> dict[str, tuple[dict[int, float], int]]:
    """Per dataset: {in flight: relative error} over UNDER_LOAD, and the first batch where plain decoding is faster."""
    c = dspark_prior()
    out = {}
    for name, (length, gains) in HELD_OUT_DSPARK.items():
        alpha = alpha_from_mean_length(length, 7)
        measured = dict(zip(IN_FLIGHT, gains, strict=True))
        errors = {b: load_gain(alpha, c, load, b) / measured[b] - 1 for b in UNDER_LOAD}
        crossing = next(b for b in range(1, 2049) if load_gain(alpha, c, load, b) < 1.0)
        out[name] = (errors, crossing)
    return out


def test_held_out_dspark_under_load_on_a_b200() -> None:
    """The device class load model (default context, η from the NIM rows, ShareGPT's prompt/output ratio for the
    prefill of arriving prompts) against the held-out load sweep. Both datasets are within 25 % at every point from 2 to
    64 in flight; HumanEval crosses inside (64, 128]. math_reasoning crosses at ~235, past the measured (64, 128]: a
    known miss, stated in docs/concepts/economics.md, bounded here so that a regression fails."""
    result = held_out_dspark_under_load(dspark_load())
    for name, (errors, _) in result.items():
        assert max(abs(e) for e in errors.values()) < 0.25, (name, errors)  # the target; 0.11 and 0.16 at 64
    _, crossing = result["HumanEval"]
    assert 64 < crossing <= 128  # the target; 108
    _, crossing = result["math_reasoning"]
    assert 128 < crossing < 250  # the known miss: 235; the measured crossover is in (64, 128]


def test_the_prefill_of_arriving_prompts() -> None:
    """Under a closed loop a request generating g tokens a step brings g·prompt/output prompt tokens a step: plain
    decoding prefills prompt/output tokens per request, a speculating server E(α, K) times as many. Priced at the
    verifier's (and the draft's) per-token arithmetic, it brings both held-out datasets closer at 32 and 64 in flight
    (HumanEval at 16 moves from +1 % to -3 %), and leaves batch 1 all but unchanged."""
    m = dspark_load()
    assert SHAREGPT.prompt_per_output == pytest.approx(161.31 / 337.99)
    # plain: each request adds prompt/output tokens of arithmetic to the step; none without a workload
    per_request = (m.verifier_request_ms + m.verifier_token_ms * (1 + SHAREGPT.prompt_per_output)) / (
        m.verifier(1, 1) + SHAREGPT.prompt_per_output * m.verifier_token_ms
    )
    assert plain_step(m, 65) - plain_step(m, 1) == pytest.approx(64 * per_request)
    assert plain_step(m, 64) > plain_step(m, 64, None)
    # speculating: the prefill grows with the tokens a request gains a step
    e1, e4 = 1.5, 4.0
    short = speculative_step(m, 64, 7, 0.15, "dspark", generated=e1)
    long = speculative_step(m, 64, 7, 0.15, "dspark", generated=e4)
    bare = speculative_step(m, 64, 7, 0.15, "dspark", generated=e4, workload=None)
    assert long > short > bare * plain_step(m, 1, None) / plain_step(m, 1)
    # against the held-out rows: closer at 32 and 64 for both datasets, crossovers earlier; batch 1 moves under 1 %
    c = dspark_prior()
    with_prefill = held_out_dspark_under_load(m)
    for name, (length, _) in HELD_OUT_DSPARK.items():
        alpha = alpha_from_mean_length(length, 7)
        without = {b: load_gain(alpha, c, m, b, None) for b in (1, 16, 32, 64)}
        assert load_gain(alpha, c, m, 1) == pytest.approx(without[1], rel=0.01)
        measured = dict(zip(IN_FLIGHT, HELD_OUT_DSPARK[name][1], strict=True))
        for b in (32, 64):
            assert abs(with_prefill[name][0][b]) < abs(without[b] / measured[b] - 1), (name, b)
        crossing_without = next(b for b in range(1, 2049) if load_gain(alpha, c, m, b, None) < 1.0)
        assert with_prefill[name][1] < crossing_without


def test_the_load_model_beats_the_saturation_model_under_load() -> None:
    """What the load model replaces: a verifier step flat up to 256 tokens, 20-100 % high between 8 and 64."""
    c = dspark_prior()
    new = held_out_dspark_under_load(dspark_load())
    for name, (length, gains) in HELD_OUT_DSPARK.items():
        alpha = alpha_from_mean_length(length, 7)
        measured = dict(zip(IN_FLIGHT, gains, strict=True))
        old = {b: throughput_gain(alpha, 7, c, b) / measured[b] - 1 for b in UNDER_LOAD}
        assert max(old[b] for b in (16, 32, 64)) > 0.4
        for b in (8, 16, 32, 64):
            assert abs(new[name][0][b]) < abs(old[b]), (name, b)


def test_the_schedule_with_the_load_model() -> None:
    """cutoff_schedule with the device class load model: full K at small batches, K falling as the batch grows
    (a shorter block costs the verifier less), and never more K for HumanEval (shorter accepted length) than for
    math_reasoning."""
    load, c = dspark_load(), dspark_prior()
    ks = {}
    for name, (length, _) in HELD_OUT_DSPARK.items():
        sched = cutoff_schedule(alpha_from_mean_length(length, 7), c, 7, 512, algorithm="dspark", load=load)
        ks[name] = [sched.k_at(b) for b in range(1, 513)]
        assert ks[name][0] == 7
        assert ks[name] == sorted(ks[name], reverse=True)
        assert ks[name][-1] < ks[name][63] < 7
    assert all(h <= m for h, m in zip(ks["HumanEval"], ks["math_reasoning"], strict=True))


# ------------------------------------------------------------------ the load model's coefficients

# NVIDIA NIM LLM benchmarking, performance page (https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance):
# Llama-3.3-70B-Instruct, NIM 1.8.0, 2 x H100 80G, FP8, TP2, 5000 input / 500 output tokens; (concurrency, ITL ms)
# below the point where TTFT shows queueing (100 and above).
NIM_70B_FP8_TP2 = [(1, 18.58), (5, 21.83), (25, 38.75), (50, 59.73)]
LLAMA_70B = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "intermediate_size": 28672, "vocab_size": 128256}  # fmt: skip
H100_FP8_TFLOPS = 1979  # dense FP8, NVIDIA's H100 SXM datasheet


def test_the_compute_efficiency_comes_from_the_nim_rows() -> None:
    """η: each request in flight adds to the step its tokens' arithmetic (one decode token plus the prefill its
    prompt spreads over its answer, 5000 / 500) and the read of its KV cache (FP8 in this profile, the context at its
    middle); the slope of ITL over concurrency, less the KV reads, is the arithmetic at η of the FP8 dense rate."""
    n = len(NIM_70B_FP8_TP2)
    mean_b = sum(b for b, _ in NIM_70B_FP8_TP2) / n
    mean_t = sum(t for _, t in NIM_70B_FP8_TP2) / n
    slope_ms = sum((b - mean_b) * (t - mean_t) for b, t in NIM_70B_FP8_TP2) / sum(
        (b - mean_b) ** 2 for b, _ in NIM_70B_FP8_TP2
    )
    tp, bw = 2, 3350e9 * BANDWIDTH_EFFICIENCY
    kv = kv_bytes_per_token(LLAMA_70B)
    assert kv == 2 * 80 * 8 * 128 * 2  # BF16 here; the FP8 profile holds half
    kv_ms = 1e3 * (5000 + 250) * (kv / 2) / tp / bw
    tokens = 1 + 5000 / 500
    flops = tokens * 2 * verifier_active_parameters(LLAMA_70B) / tp
    eta = flops / (H100_FP8_TFLOPS * 1e12 * (slope_ms - kv_ms) * 1e-3)
    assert eta == pytest.approx(COMPUTE_EFFICIENCY, abs=0.01)


def test_the_load_model_is_physical() -> None:
    s = size(EAGLE3_8B, LLAMA_8B)
    assert kv_bytes_per_token(LLAMA_8B) == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token({"hidden_size": 64}) is None
    assert draft_kv_bytes_per_token(EAGLE3_8B) == 2 * 1024 * 2
    m = load_model(s, "nvidia-h100-80gb-hbm3", kv_bytes_per_token(LLAMA_8B))
    assert m is not None
    # a batch-1 step is the prior's: τ_step plus the weight reads; one more token costs its arithmetic only
    h100 = DEVICES["h100"]
    reads = 1e3 * 2 * s.verifier / (h100.bandwidth_gbs * 1e9)
    assert m.verifier(1, 1) - m.verifier_token_ms - m.verifier_request_ms == pytest.approx(h100.step_ms + reads)
    # a longer context, more requests or more tokens cost more; tensor parallelism splits every part
    longer = load_model(s, "h100", kv_bytes_per_token(LLAMA_8B), context_tokens=4096)
    assert longer is not None
    assert longer.verifier(64, 1) > m.verifier(64, 1) > m.verifier(8, 1)
    split = load_model(s, "h100", kv_bytes_per_token(LLAMA_8B), tensor_parallel=2)
    assert split is not None
    assert split.verifier_token_ms == pytest.approx(m.verifier_token_ms / 2)
    # a chain drafter's step runs K forwards of one position, a parallel drafter's one forward of K + 1
    e = expected_tokens(0.7, 4)
    chain = speculative_step(m, 16, 4, 0.1, "eagle3", generated=e)
    assert chain > speculative_step(m, 16, 4, 0.1, "dspark", generated=e)
    assert plain_step(m, 1) == 1.0
    # a CPU keeps the saturation model; an unknown GPU gets the default row
    assert load_model(s, "cpu", kv_bytes_per_token(LLAMA_8B)) is None
    assert load_model(s, None, kv_bytes_per_token(LLAMA_8B)) == m


# ------------------------------------------------------------------ the device classes


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA-H100-80GB-HBM3", "h100"),
        ("NVIDIA-H100-NVL", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA-GH200-480GB", "gh200"),
        ("NVIDIA-B200", "b200"),
        ("NVIDIA-GB200", "b200"),
        ("NVIDIA-A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA-A100-SXM4-80GB", "a100"),
        ("NVIDIA A10G", "a10"),
        ("NVIDIA-L40S", "l40s"),
        ("NVIDIA-L4", "l4"),
        ("cpu", "cpu"),
        ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", DEFAULT),
        ("Tesla-T4", DEFAULT),
    ],
)
def test_device_names_map_to_a_prior_row(name: str, key: str) -> None:
    assert prior_key(device_class(name)) == key


def test_unknown_and_unsaid_devices_get_the_stated_default() -> None:
    s = size(EAGLE3_8B, LLAMA_8B)
    default = prior(s, None, "eagle3", 3)
    assert default.key == DEFAULT
    assert default.cost_ratio == pytest.approx(prior(s, "nvidia-h100-80gb-hbm3", "eagle3", 3).cost_ratio)
    assert prior(s, "some-new-accelerator", "eagle3", 3).key == DEFAULT


def test_a_cpu_keeps_the_parameter_ratio() -> None:
    s = size(EAGLE3_8B, LLAMA_8B)
    p = prior(s, "cpu", "eagle3", 3)
    assert (p.key, p.cost_ratio) == ("cpu", s.parameter_ratio)


def test_the_prior_moves_the_right_way() -> None:
    s = size(EAGLE3_8B, LLAMA_8B)
    c = {key: prior(s, key, "eagle3", 3).cost_ratio for key in ("h100", "h200", "b200", "a100", "l40s")}
    # more bandwidth: the fixed times weigh more, so a small draft costs more of a step
    assert c["l40s"] < c["a100"]
    assert c["h100"] < c["h200"] < c["b200"]
    # tensor parallelism shrinks the weight reads, not the fixed times: the draft's share grows
    assert prior(s, "h100", "eagle3", 3, tensor_parallel=4).cost_ratio > c["h100"]
    # a draft without an lm_head of its own reads the verifier's
    assert size(EAGLE1_8B, LLAMA_8B).shared_head == 128256 * 4096
    assert size(EAGLE3_8B, LLAMA_8B).shared_head == 0
    # a parallel drafter's one forward grows with its positions, a chain drafter's does not depend on K
    d = size(DSPARK_27B, QWEN_27B)
    assert prior(d, "b200", "dspark", 16).cost_ratio > prior(d, "b200", "dspark", 4).cost_ratio
    assert prior(s, "h100", "eagle3", 7).cost_ratio == prior(s, "h100", "eagle3", 2).cost_ratio


def test_a_row_needs_a_forward_and_a_speedup() -> None:
    with pytest.raises(ValueError, match="forwards"):
        implied_cost_ratio(2.0, 1.5, 0)
    assert implied_cost_ratio(2.0, 1.6, 1) == pytest.approx(0.25)
