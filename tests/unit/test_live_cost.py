"""Live step times keep the measured cost true (telemetry/acceptance.py `live_cost`): the window's mean step time
against the sweep's plain step time at the same batch prices the draft once enough drafts exist; without a sweep the
parameters stand and say so; status.economics takes the live cost only on a material change, and a later pass keeps it
while the draft's sweep is the same."""

from __future__ import annotations

import pytest

from speculator_operator.api.common import make_condition
from speculator_operator.api.deployment import PairEconomics, SpeculatorDeploymentStatus, SweepRef
from speculator_operator.planning.measured import Measured, with_measured
from speculator_operator.telemetry.acceptance import Economics, acceptance_status, interpolate, live_cost, plan_update
from speculator_operator.telemetry.vllm_metrics import Totals, parse_sample

from ..clock import NOW

PLAIN = ((1.0, 10.0), (2.0, 12.0), (4.0, 16.0))  # the sweep's plain step time (ms) per batch
SWEPT = Economics(k=3, algorithm="eagle3", cost_ratio=0.1, max_k=3, source="sweep", plain_steps=PLAIN)


def window(step_ms: float, batch: float, drafts: float = 1000.0, accepted: float = 2000.0) -> Totals:
    """A window of 1000 request-steps at `batch` requests per step, each `step_ms` long, every one drafting."""
    count = 1000.0
    return Totals(drafts=drafts, draft_tokens=drafts * 3, accepted=accepted, generated=count * 3,
                  itl_sum=count * step_ms / 1000, itl_count=count, steps=count / batch, span=60, counted=1)  # fmt: skip


def test_the_plain_step_time_is_interpolated_at_the_live_batch() -> None:
    assert interpolate(PLAIN, 1.0) == 10.0
    assert interpolate(PLAIN, 3.0) == pytest.approx(14.0)
    assert interpolate(PLAIN, 0.5) == 10.0  # below the sweep: its first point
    assert interpolate(PLAIN, 64.0) == 16.0  # above it: its last


def test_live_step_times_price_the_draft() -> None:
    live = live_cost(window(step_ms=18.0, batch=3.0), SWEPT, min_samples=200)
    assert live is not None
    assert live.batch == pytest.approx(3.0)
    assert live.plain_step_ms == pytest.approx(14.0)
    assert live.cost_ratio == pytest.approx((18.0 / 14.0 - 1) / 3)  # three draft forwards at K=3 (eagle3)


def test_no_live_estimate_without_a_sweep_enough_drafts_or_a_speculating_window() -> None:
    assert live_cost(window(18.0, 3.0), Economics(3, "eagle3", 0.1, 3), 200) is None  # no sweep: parameters
    assert live_cost(window(18.0, 3.0, drafts=100), SWEPT, 200) is None  # too few drafts to judge
    assert live_cost(window(18.0, 3.0, drafts=500), SWEPT, 200) is None  # half the steps did not draft


def test_the_figures_follow_the_live_cost_and_say_where_it_came_from() -> None:
    parameters = acceptance_status(
        window(18.0, 3.0), Economics(3, "eagle3", 0.02, 3), revision="r", observed_at="t", min_samples=200
    )
    assert parameters.cost_source == "parameters"
    assert parameters.step_ms is None
    slow = acceptance_status(window(30.0, 3.0), SWEPT, revision="r", observed_at="t", min_samples=200)
    fast = acceptance_status(window(15.0, 3.0), SWEPT, revision="r", observed_at="t", min_samples=200)
    assert (slow.cost_source, fast.cost_source) == ("live", "live")
    assert slow.step_ms == 30.0
    assert slow.plain_step_ms == 14.0
    assert slow.batch == 3.0
    assert slow.predicted_speedup is not None
    assert fast.predicted_speedup is not None
    assert slow.predicted_speedup < fast.predicted_speedup  # the same acceptance costs more when steps are slower
    assert parameters.predicted_speedup is not None
    assert parameters.predicted_speedup > fast.predicted_speedup  # the parameter model flatters the draft


def test_economics_takes_the_live_cost_only_on_a_material_change() -> None:
    sweep = SweepRef(job="ml/t", device="cpu", digest="sha256:x")
    current = SpeculatorDeploymentStatus(
        economics=PairEconomics(cost_ratio=0.02, source="sweep", effective_cost_ratio=0.1, sweep=sweep)
    )
    cond = make_condition(1, "SpeculationEffective", True, "AboveBreakEven", "x")
    acc = acceptance_status(window(18.0, 3.0), SWEPT, revision="r", observed_at="t", min_samples=200)
    first = plan_update(current, acc, cond, None, now=NOW)
    assert first.status is not None
    assert first.status.economics is not None
    assert first.status.economics.source == "live"
    assert first.status.economics.effective_cost_ratio == acc.cost_ratio
    # the next window moves the cost by less than the material step: no write
    nudged = acceptance_status(window(18.02, 3.0), SWEPT, revision="r", observed_at="t2", min_samples=200)
    again = plan_update(first.status, nudged, cond, None, now=NOW)
    assert again.status is None
    # a material move is written, economics and acceptance in the same write
    slower = acceptance_status(window(24.0, 3.0), SWEPT, revision="r", observed_at="t3", min_samples=200)
    moved = plan_update(first.status, slower, cond, None, now=NOW)
    assert moved.status is not None
    assert moved.status.economics is not None
    assert moved.status.economics.effective_cost_ratio == slower.cost_ratio
    assert moved.status.acceptance == slower
    # a pass that recomputes the pair's economics from the same sweep keeps the live cost; another sweep resets it
    base = PairEconomics(cost_ratio=0.02)
    same = Measured(None, {"source": "sweep", "effective_cost_ratio": 0.1, "sweep": sweep})
    kept = with_measured(base, same, first.status.economics)
    assert (kept.source, kept.effective_cost_ratio) == ("live", acc.cost_ratio)
    other = Measured(None, {"source": "sweep", "effective_cost_ratio": 0.1, "sweep": SweepRef(digest="sha256:y")})
    reset = with_measured(base, other, first.status.economics)
    assert (reset.source, reset.effective_cost_ratio) == ("sweep", 0.1)


def test_the_step_series_are_read_from_vllms_own_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts counter",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0',
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0',
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 90.0',
            "# TYPE vllm:inter_token_latency_seconds histogram",
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 44.0',
            'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 44.0',
            'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.44',
            "# TYPE vllm:iteration_tokens_total histogram",
            'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 30.0',
            'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 30.0',
            'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 200.0',
        ]
    )
    sample = parse_sample(text + "\n")
    assert (sample.itl_sum, sample.itl_count, sample.steps) == (0.44, 44.0, 30.0)


def test_tuning_prices_k_with_the_live_cost_of_the_same_judgement() -> None:
    from speculator_operator.telemetry.acceptance import priced

    live = acceptance_status(window(24.0, 3.0), SWEPT, revision="r", observed_at="t", min_samples=200)
    assert priced(SWEPT, live).cost_ratio == live.cost_ratio != SWEPT.cost_ratio
    parameters = acceptance_status(window(24.0, 3.0), SWEPT, revision="r", observed_at="t", min_samples=5000)
    assert priced(SWEPT, parameters) == SWEPT  # too few drafts for a live cost: the stored one stands
