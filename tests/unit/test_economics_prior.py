"""The device class prior (domain/priors.py): its coefficients re-derived from the public calibration rows, and the
held-out check against the two sources that judge it and were not used to fit it (docs/concepts/economics.md).

A row's implied cost: a step costs mean_length / speedup plain steps = 1 + n·c. Every figure below is copied from the
cited public page; nothing here was measured by this project."""

from __future__ import annotations

import pytest

from speculator_operator.domain.economics import (
    alpha_from_mean_length,
    cutoff_schedule,
    expected_tokens,
    speedup,
    step_cost,
    verifier_active_parameters,
)
from speculator_operator.domain.priors import (
    DEFAULT,
    DEVICES,
    PairSize,
    forward_ms,
    implied_cost_ratio,
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


def test_held_out_dspark_crossover_under_load() -> None:
    """The load model (cutoff_schedule's saturation at its default 256 tokens) with the prior's c at K = 7. HumanEval's
    crossover lands inside the measured (64, 128]; math_reasoning's at ~142, past it (docs/concepts/economics.md)."""
    c = dspark_prior()
    crossings = {}
    for name, (length, _) in HELD_OUT_DSPARK.items():
        alpha = alpha_from_mean_length(length, 7)
        crossings[name] = next(b for b in range(1, 513) if throughput_gain(alpha, 7, c, b) < 1.0)
    assert 64 < crossings["HumanEval"] <= 128
    assert 128 < crossings["math_reasoning"] < 150  # a known miss of the load model, not of the prior: said in docs
    # the schedule cutoff_schedule picks for the HumanEval pair speculates at small batches and stops at large ones
    sched = cutoff_schedule(alpha_from_mean_length(3.40, 7), c, 7, 256, algorithm="dspark")
    assert sched.k_at(1) == 7
    assert sched.k_at(256) == 0


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
