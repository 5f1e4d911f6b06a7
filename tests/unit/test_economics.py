"""The speedup model, break-even acceptance, choice of K and the load cut-off."""

from __future__ import annotations

import itertools

import pytest

from speculator_operator.domain.economics import (
    best_k,
    break_even_alpha,
    cost_ratio,
    cutoff_schedule,
    draft_active_parameters,
    expected_tokens,
    schedule_from_cutoff,
    speedup,
    verifier_active_parameters,
)

from ..ckptgen import QWEN3_8B, eagle3


def test_the_reference_figures() -> None:
    # the check: c = 0.0488, K = 3
    assert break_even_alpha(3, 0.0488) == pytest.approx(0.128, abs=5e-4)
    assert speedup(0.78, 3, 0.0488) == pytest.approx(2.50, abs=5e-3)


def test_expected_tokens() -> None:
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # continuous at alpha -> 1
    assert expected_tokens(0.999999, 4) == pytest.approx(5.0, rel=1e-5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_tokens(1.2, 3)
    with pytest.raises(ValueError, match="K must be"):
        expected_tokens(0.5, -1)


def test_break_even_is_where_speedup_is_one() -> None:
    for k, c in [(1, 0.1), (3, 0.0488), (8, 0.02), (5, 0.3)]:
        a = break_even_alpha(k, c)
        assert a is not None
        assert speedup(a, k, c) == pytest.approx(1.0, abs=1e-9)
        assert speedup(a + 0.01, k, c) > 1.0 > speedup(max(0.0, a - 0.01), k, c)
    # a draft as costly as the target never pays
    assert break_even_alpha(3, 1.0) is None
    # a parallel drafter pays one forward for K tokens
    assert break_even_alpha(8, 0.05, forwards=1) < break_even_alpha(8, 0.05)  # type: ignore[operator]


def test_best_k_grows_with_acceptance_and_is_zero_when_drafts_lose() -> None:
    ks = [best_k(a, 0.05)[0] for a in (0.3, 0.6, 0.8, 0.9)]
    assert ks == sorted(ks)
    assert ks[-1] > ks[0] >= 1
    assert best_k(0.01, 0.5) == (0, 1.0)
    _k, s = best_k(0.78, 0.0488)
    assert s == pytest.approx(max(speedup(0.78, j, 0.0488) for j in range(1, 17)))


def test_cost_ratio_from_a_qwen3_8b_eagle3_header() -> None:
    _, tensors = eagle3()
    shapes = {n: tuple(s) for n, (_, s) in tensors.items()}
    draft = draft_active_parameters(shapes)
    # frozen embeddings and vocab maps are excluded, the rest counted
    assert draft == sum(
        __import__("math").prod(s) for n, s in shapes.items() if n not in ("embed_tokens.weight", "t2d", "d2t")
    )
    target = verifier_active_parameters(QWEN3_8B)
    assert 7.0e9 < target < 8.5e9  # Qwen3-8B: ~7.6B parameters a token touches (embeddings excluded)
    c = cost_ratio(shapes, target)
    assert 0.03 < c < 0.08


def test_schedule_from_cutoff() -> None:
    assert schedule_from_cutoff(3, 32, 256).as_list() == [[1, 32, 3], [33, 256, 0]]
    assert schedule_from_cutoff(3, 512, 256).as_list() == [[1, 256, 3]]
    with pytest.raises(ValueError, match="K must be"):
        schedule_from_cutoff(0, 32, 256)


@pytest.mark.parametrize(
    ("alpha", "c", "algo"), [(0.78, 0.0488, "eagle3"), (0.6, 0.02, "dflash"), (0.9, 0.1, "eagle3")]
)
def test_cutoff_schedule_is_valid_for_vllm(alpha: float, c: float, algo: str) -> None:
    sched = cutoff_schedule(alpha, c, 8, 256, algorithm=algo)
    ranges = sched.as_list()
    assert ranges[0][0] == 1  # vLLM requires the first range to start at 1
    assert ranges[-1][1] == 256
    for (s1, e1, _), (s2, _, _) in itertools.pairwise(ranges):
        assert s1 <= e1
        assert s2 == e1 + 1
    ks = [k for _, _, k in ranges]
    assert all(0 <= k <= 8 for k in ks)
    assert ks == sorted(ks, reverse=True)  # speculation only shrinks as batches grow
    assert sched.k_at(1) == ks[0] >= 1
    assert sched.k_at(256) == 0  # large batches are compute-bound: no drafts


def test_cutoff_schedule_small_batches_use_best_k() -> None:
    sched = cutoff_schedule(0.78, 0.0488, 16, 64)
    assert sched.k_at(1) == best_k(0.78, 0.0488)[0]
