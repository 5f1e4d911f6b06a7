"""Live acceptance arithmetic: parsing vLLM's counters, per-pod increments and resets, the window, α from
the mean accepted length, the status and the SpeculationEffective condition."""

from __future__ import annotations

import pytest

from speculator_operator.api.common import evolve
from speculator_operator.api.deployment import Acceptance, SpeculatorDeploymentStatus
from speculator_operator.domain.economics import alpha_from_mean_length, break_even_alpha, expected_tokens, speedup
from speculator_operator.planning import apply_merge_patch, merge_patch
from speculator_operator.telemetry.acceptance import (
    Economics,
    acceptance_status,
    changed_materially,
    effective_condition,
    first_measure_due,
)
from speculator_operator.telemetry.vllm_metrics import MetricsError, Sample, Totals, Window, increment, parse_sample


def metrics_text(
    drafts: float,
    draft_tokens: float,
    accepted: float,
    per_pos: list[float],
    engines: int = 1,
    running: float = 0,
    generated: float = 0,
) -> str:
    """Exposition text shaped like vLLM's (one series per engine; counters with _total and _created)."""
    lines = []
    for name, value in (
        ("vllm:spec_decode_num_drafts", drafts),
        ("vllm:spec_decode_num_draft_tokens", draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", accepted),
        ("vllm:generation_tokens", generated),
    ):
        lines += [f"# HELP {name}_total x", f"# TYPE {name}_total counter"]
        for e in range(engines):
            lines.append(f'{name}_total{{engine="{e}",model_name="m"}} {value / engines}')
            lines.append(f'{name}_created{{engine="{e}",model_name="m"}} 1.7e9')
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {name}_total x", f"# TYPE {name}_total counter"]
    for e in range(engines):
        for p, v in enumerate(per_pos):
            lines.append(f'{name}_total{{engine="{e}",model_name="m",position="{p}"}} {v / engines}')
    lines += ["# HELP vllm:num_requests_running x", "# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {running / engines}' for e in range(engines)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.2, 0.5, 0.8, 0.97, 1.0])
def test_alpha_inverts_expected_tokens(alpha: float, k: int) -> None:
    assert alpha_from_mean_length(expected_tokens(alpha, k), k) == pytest.approx(alpha, abs=1e-9)


def test_the_rate_is_not_alpha() -> None:
    """The issue's example: at α = 0.2, K = 3 the rate is ≈ 0.083, below α* ≈ 0.128, yet speculation pays."""
    k, c = 3, 0.0488
    mean_length = expected_tokens(0.2, k)  # 1.248
    drafts = 10_000
    accepted = (mean_length - 1) * drafts
    totals = Totals(drafts=drafts, draft_tokens=k * drafts, accepted=accepted, per_position=[], span=60, counted=1)
    acc = acceptance_status(totals, Economics(k, "eagle3", c, 3), revision="r", observed_at="t", min_samples=100)
    assert acc.rate == pytest.approx(0.0827, abs=1e-3)
    assert acc.alpha == pytest.approx(0.2, abs=1e-4)
    assert acc.break_even_alpha == pytest.approx(0.128, abs=2e-3)
    assert acc.rate < acc.break_even_alpha < acc.alpha
    assert acc.predicted_speedup == pytest.approx(speedup(0.2, 3, c), abs=1e-3)
    assert acc.predicted_speedup > 1
    assert effective_condition(acc, 1, 100).status == "True"


def test_parse_sums_engines_and_positions_and_ignores_created() -> None:
    text = metrics_text(100, 300, 150, [80, 50, 20], engines=2, running=4, generated=1000)
    s = parse_sample(text)
    assert (s.drafts, s.draft_tokens, s.accepted) == (100, 300, 150)
    assert s.per_position == (80, 50, 20)
    assert s.running == 4
    assert s.generated == 1000


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<html>502 Bad Gateway</html>", "Unparseable"),
        ("vllm:spec_decode_num_drafts_total{ 12\n", "Unparseable"),
        ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n", "NoSpecDecodeMetrics"),
        ("", "NoSpecDecodeMetrics"),
        (metrics_text(1, 3, 2, [1]).replace(" 2.0\n", " -2.0\n", 1), "Unparseable"),
        (metrics_text(1, 3, 2, [1]).replace('position="0"', 'position="x"'), "Unparseable"),
    ],
)
def test_bad_metrics_say_why(text: str, reason: str) -> None:
    with pytest.raises(MetricsError) as err:
        parse_sample(text)
    assert err.value.reason == reason


def test_increment_and_counter_reset() -> None:
    a = Sample(drafts=100, draft_tokens=300, accepted=150, per_position=(80, 50, 20))
    b = Sample(drafts=110, draft_tokens=330, accepted=160, per_position=(88, 53, 21))
    inc, reset = increment(a, b, 0.0, 1.0)
    assert not reset
    assert (inc.drafts, inc.draft_tokens, inc.accepted, inc.per_position) == (10, 30, 10, (8, 3, 1))
    restarted = Sample(drafts=5, draft_tokens=15, accepted=9, per_position=(4, 3, 2))
    inc, reset = increment(b, restarted, 1.0, 2.0)
    assert reset  # a restarted pod: its new value is the increase
    assert (inc.drafts, inc.accepted, inc.per_position) == (5, 9, (4, 3, 2))


def test_window_counts_the_served_revision_and_says_what_it_left_out() -> None:
    w = Window(seconds=60)
    for t, n in ((0.0, 0), (15.0, 100), (30.0, 200)):
        w.observe("new-a", "r2", Sample(drafts=n, draft_tokens=3 * n, accepted=2 * n, per_position=(n, n / 2)), t)
        w.observe("old-b", "r1", Sample(drafts=9 * n, draft_tokens=27 * n, accepted=0), t)
    w.failed("new-c", "r2", "Timeout", "no answer", 30.0)
    totals = w.totals("r2", 30.0)
    assert (totals.drafts, totals.accepted, totals.counted, totals.other_revision) == (200, 400, 1, 1)
    assert totals.failing == {"new-c": ("Timeout", "no answer")}
    assert totals.span == pytest.approx(30.0)  # two increments of 15 s
    # increments older than the window drop out
    w.observe("new-a", "r2", Sample(drafts=200, draft_tokens=600, accepted=400, per_position=(200, 100)), 100.0)
    assert w.totals("r2", 100.0).drafts == 0
    # a pod that went away is forgotten
    w.keep_only({"new-a"})
    assert set(w.pods) == {"new-a"}


def test_a_pod_that_recovers_is_counted_again() -> None:
    w = Window(seconds=300)
    w.observe("p", "r", Sample(drafts=10, draft_tokens=30, accepted=30), 0.0)
    w.failed("p", "r", "HTTPError", "500", 15.0)
    assert w.totals("r", 15.0).counted == 0
    w.observe("p", "r", Sample(drafts=20, draft_tokens=60, accepted=60), 30.0)
    totals = w.totals("r", 30.0)
    assert totals.counted == 1
    assert totals.drafts == 10


def _acc(drafts: float, accepted_per_draft: float, k: int = 3, c: float | None = 0.05, counted: int = 1) -> Acceptance:
    totals = Totals(
        drafts=drafts,
        draft_tokens=k * drafts,
        accepted=accepted_per_draft * drafts,
        span=60,
        counted=counted,
        per_position=[drafts * 0.9, drafts * 0.8, drafts * 0.7],
    )
    return acceptance_status(totals, Economics(k, "eagle3", c, 5), revision="r", observed_at="t", min_samples=100)


def test_conditions() -> None:
    good = _acc(1000, 2.9)
    assert effective_condition(good, 3, 100).reason == "AboveBreakEven"
    assert good.percent == "96.7%"
    assert good.per_position == [0.9, 0.8, 0.7]
    bad = _acc(1000, 0.01)
    cond = effective_condition(bad, 3, 100)
    assert (cond.status, cond.reason) == ("False", "BelowBreakEven")
    assert "α 0.010" in cond.message
    assert f"break-even α* {break_even_alpha(3, 0.05):.3f}" in cond.message
    assert effective_condition(_acc(50, 2.9), 3, 100).reason == "NotEnoughSamples"
    assert effective_condition(_acc(1000, 2.9, c=None), 3, 100).reason == "NoCostModel"
    nothing = acceptance_status(
        Totals(failing={"p": ("Timeout", "x")}),
        Economics(3, "eagle3", 0.05, 3),
        revision="r",
        observed_at="t",
        min_samples=100,
    )
    cond = effective_condition(nothing, 3, 100)
    assert (cond.status, cond.reason) == ("Unknown", "NoMetrics")
    assert "p: Timeout" in cond.message


def test_recommended_k_within_the_checkpoint() -> None:
    assert _acc(1000, 2.99).recommended_k == 5  # near-perfect acceptance: as many as the checkpoint allows
    assert _acc(1000, 0.0).recommended_k == 0  # nothing accepted: do not speculate


def test_only_material_changes_are_written() -> None:
    a = _acc(1000, 2.0)
    assert not changed_materially(a, _acc(1010, 2.0001))
    assert changed_materially(a, _acc(1000, 1.5))
    assert changed_materially(None, a)
    moved = evolve(a, None, revision="r2")
    assert changed_materially(a, moved)
    # the drafts count alone is not (it swings with how many scrapes the window holds)
    assert not changed_materially(a, evolve(a, None, drafts=1500))


def test_merge_patch_removes_what_is_gone() -> None:
    old = {"rate": 1.0, "note": "x", "pods": {"counted": 1, "failing": [{"pod": "p"}]}}
    new = {"rate": 0.5, "pods": {"counted": 2}}
    assert merge_patch(old, new) == {"rate": 0.5, "note": None, "pods": {"counted": 2, "failing": None}}
    assert merge_patch(None, new) == new


def test_a_merge_patch_applied_gives_what_it_was_made_from() -> None:
    old = {"rate": 0.4, "note": "few samples", "pods": {"counted": 1, "failing": 1}, "k": [1, 2]}
    new = {"rate": 0.5, "pods": {"counted": 2}, "k": [3]}
    assert apply_merge_patch(old, merge_patch(old, new)) == new
    assert apply_merge_patch(old, {}) == old  # nothing to change
    assert apply_merge_patch(None, {"a": {"b": None, "c": 1}}) == {"a": {"c": 1}}
    assert apply_merge_patch({"a": 1}, 2) == 2  # a value that is not an object replaces the target


def test_the_first_measure_waits_for_the_resources_ready_or_a_whole_interval_of_a_ready_pod() -> None:
    deploying, ready = SpeculatorDeploymentStatus(phase="Deploying"), SpeculatorDeploymentStatus(phase="Ready")
    # no ready pod: nothing to measure
    assert not first_measure_due(deploying, False, None, 100.0, 30.0)
    assert not first_measure_due(ready, False, None, 100.0, 30.0)
    # a pod just turned ready while the resource still rolls out: not yet
    assert not first_measure_due(deploying, True, 100.0, 100.0, 30.0)
    assert not first_measure_due(deploying, True, 80.0, 100.0, 30.0)
    # the resource is Ready, or the pod has been ready a whole interval (a rollout stuck short of all)
    assert first_measure_due(ready, True, 100.0, 100.0, 30.0)
    assert first_measure_due(deploying, True, 70.0, 100.0, 30.0)
    # once measured, always (a later rollout's pods are measured as they come)
    measured = SpeculatorDeploymentStatus.model_validate({"phase": "Deploying", "acceptance": {"rate": 0.5}})
    assert first_measure_due(measured, False, None, 100.0, 30.0)
