"""A measured sweep's curve and what it decides (domain/sweep.py): the best K per concurrency, the crossover, and
the choice between no speculation, a static K and a per-batch-size schedule that vLLM 0.32.0's own validator
accepts, the schedule's own cost counted at every batch size, K = 0 included."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from speculator_operator.domain.sweep import (
    PLAIN,
    Curve,
    Point,
    SweepError,
    assemble,
    batch_sizes,
    choose,
    concurrencies,
    device_class,
)


def curve(rates: Mapping[int, Mapping[int, float]], running: Mapping[int, float] | None = None) -> Curve:
    """A curve from {K: {concurrency: tokens/s}} (K 0: plain), each point 1 s long."""
    points = []
    for k, row in rates.items():
        for c, rate in row.items():
            r = None if running is None else running[c]
            points.append(Point(k, c, requests=2 * c, tokens=round(rate * 10), seconds=10.0, itl_ms=5.0, running=r))
    ks = tuple(sorted((k for k in rates if k), reverse=True))
    cs = tuple(sorted({c for row in rates.values() for c in row}))
    return Curve("cpu", ks, cs, tuple(points))


def vllm_accepts(ranges: list[list[int]]) -> None:
    """vLLM 0.32.0's validate_and_normalize_dynamic_sd_schedule, restated: positive sorted non-overlapping
    inclusive ranges, K >= 0, the first from 1."""
    previous = 0
    for start, end, k in ranges:
        assert 0 < start <= end
        assert k >= 0
        assert start > previous
        previous = end
    assert ranges[0][0] == 1


def test_concurrencies_double_up_to_the_bound_and_never_past_the_prompts() -> None:
    assert concurrencies(64, 1000) == [1, 2, 4, 8, 16, 32, 64]
    assert concurrencies(64, 16) == [1, 2, 4, 8, 16]
    assert concurrencies(64, 5) == [1, 2, 4]
    assert concurrencies(3, 100) == [1, 2]


def test_device_names_compare_by_class() -> None:
    assert device_class("NVIDIA H100 80GB HBM3") == device_class("NVIDIA-H100-80GB-HBM3") == "nvidia-h100-80gb-hbm3"
    assert device_class("cpu") == "cpu"
    assert device_class("NVIDIA H200") != device_class("NVIDIA H100 80GB HBM3")


def test_a_monotone_curve_speculates_less_as_load_grows() -> None:
    # K=3 wins at 1-2, K=2 at 4-8, plain from 16: a schedule stepping down, with a crossover at 16
    c = curve(
        {
            3: {1: 30, 2: 55, 4: 80, 8: 100, 16: 60, 32: 80},
            2: {1: 25, 2: 50, 4: 90, 8: 120, 16: 90, 32: 120},
            PLAIN: {1: 10, 2: 20, 4: 40, 8: 80, 16: 160, 32: 320},
        }
    )
    assert [c.best(x) for x in c.concurrencies] == [3, 3, 2, 2, PLAIN, PLAIN]
    assert c.crossover() == 16
    choice = choose(c, max_num_seqs=256, k_limit=3, schedule_cost=0.14)
    assert choice.schedule is not None
    assert choice.schedule.as_list() == [[1, 3, 3], [4, 15, 2], [16, 256, 0]]
    assert choice.k == 3  # vLLM's num_speculative_tokens: the largest K of the schedule
    vllm_accepts(choice.schedule.as_list())


def test_a_non_monotone_curve_keeps_its_measured_order() -> None:
    # plain wins at 2 (a noisy or memory-bound point), K=3 again from 4: each measured batch gets its own winner
    c = curve({3: {1: 30, 2: 19, 4: 80, 8: 60}, PLAIN: {1: 10, 2: 20, 4: 40, 8: 70}})
    assert [c.best(x) for x in c.concurrencies] == [3, PLAIN, 3, PLAIN]
    assert c.crossover() == 8
    choice = choose(c, max_num_seqs=64, k_limit=3, schedule_cost=0.0)
    assert choice.schedule is not None
    assert choice.schedule.as_list() == [[1, 1, 3], [2, 3, 0], [4, 7, 3], [8, 64, 0]]
    vllm_accepts(choice.schedule.as_list())


def test_ties_go_to_the_smaller_k_and_to_the_simpler_option() -> None:
    c = curve({3: {1: 30, 2: 40}, 2: {1: 30, 2: 40}, PLAIN: {1: 10, 2: 20}})
    assert c.best(1) == c.best(2) == 2  # the same throughput with fewer draft forwards
    choice = choose(c, max_num_seqs=8, k_limit=3, schedule_cost=0.0)
    assert (choice.k, choice.schedule) == (2, None)  # one K everywhere: no schedule, which would cost for nothing


def test_plain_always_faster_means_no_speculation() -> None:
    c = curve({3: {1: 9, 2: 18, 4: 30}, 2: {1: 9.5, 2: 19, 4: 35}, PLAIN: {1: 10, 2: 20, 4: 40}})
    assert c.crossover() == 1
    choice = choose(c, max_num_seqs=8, k_limit=3, schedule_cost=0.14)
    assert (choice.k, choice.schedule) == (PLAIN, None)


def test_the_schedules_own_cost_at_k_zero_is_counted() -> None:
    # K=3 gains a little at low load and loses a little at high load: as a schedule every range, its K = 0 range
    # too, pays the cost, so the small gain does not pay for it and the static K is served; without the cost
    # the schedule would win
    c = curve({3: {1: 12, 2: 24, 4: 38, 8: 76}, PLAIN: {1: 10, 2: 20, 4: 40, 8: 80}})
    free = choose(c, max_num_seqs=16, k_limit=3, schedule_cost=0.0)
    assert free.schedule is not None
    assert free.schedule.as_list() == [[1, 3, 3], [4, 16, 0]]
    costly = choose(c, max_num_seqs=16, k_limit=3, schedule_cost=0.14)
    assert (costly.k, costly.schedule) == (3, None)
    assert costly.score == pytest.approx((1.2 + 1.2 + 0.95 + 0.95) / 4)


def test_k_limit_keeps_the_choice_within_what_the_deployment_may_serve() -> None:
    c = curve({3: {1: 40, 2: 60}, 2: {1: 30, 2: 50}, PLAIN: {1: 10, 2: 20}})
    assert choose(c, max_num_seqs=8, k_limit=2, schedule_cost=0.14).k == 2


def test_batch_sizes_come_from_the_measured_running_requests() -> None:
    # vLLM ran fewer requests than the clients kept in flight, and never more than max_num_seqs
    c = curve(
        {3: {1: 30, 2: 50, 4: 60, 8: 60}, PLAIN: {1: 10, 2: 20, 4: 40, 8: 80}},
        running={1: 1.0, 2: 1.8, 4: 3.4, 8: 7.1},
    )
    assert batch_sizes(c, max_num_seqs=256) == [(1, 1), (2, 2), (4, 3), (8, 7)]
    assert batch_sizes(c, max_num_seqs=4) == [(1, 1), (2, 2), (4, 3), (8, 4)]
    assert batch_sizes(c, max_num_seqs=2) == [(1, 1), (2, 2)]  # 4 and 8 ran the batch of 2 too
    choice = choose(c, max_num_seqs=256, k_limit=3, schedule_cost=0.0)
    assert choice.schedule is not None
    assert choice.schedule.as_list() == [[1, 6, 3], [7, 256, 0]]  # plain from the batch that c=8 ran


def test_an_incomplete_or_inconsistent_curve_is_refused() -> None:
    with pytest.raises(SweepError, match="incomplete"):
        Curve("cpu", (3,), (1, 2), (Point(3, 1, 1, 16, 1.0), Point(3, 2, 2, 32, 1.0), Point(0, 1, 1, 16, 1.0)))
    with pytest.raises(SweepError, match="twice"):
        Curve("cpu", (3,), (1,), (Point(3, 1, 1, 16, 1.0), Point(3, 1, 1, 16, 1.0), Point(0, 1, 1, 16, 1.0)))
    with pytest.raises(SweepError, match="two devices"):
        assemble("cpu", [{"device": "cpu", "points": []}, {"device": "NVIDIA H100", "points": []}])
    with pytest.raises(SweepError, match="out of range"):
        Point.from_wire({"k": 1, "c": 0, "n": 1, "tokens": 1, "s": 1})


def test_the_wire_form_round_trips_and_the_digest_names_it() -> None:
    c = curve({3: {1: 30, 2: 50}, PLAIN: {1: 10, 2: 20}}, running={1: 1.0, 2: 2.0})
    again = Curve.from_wire(c.wire())
    assert again == c
    assert again.digest() == c.digest()
    parts = [{"device": "CPU", "points": [p.wire() for p in c.points if p.k == k]} for k in (3, PLAIN)]
    assert assemble("cpu", parts).digest() == c.digest()
    summary = c.summary()
    assert summary["best"][0] == {
        "concurrency": 1,
        "bestK": 3,
        "tokensPerSecond": 30.0,
        "plainTokensPerSecond": 10.0,
        "speedup": 3.0,
    }
    assert "crossover" not in summary
    assert summary["digest"] == c.digest()
