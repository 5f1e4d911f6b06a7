"""serving.adaptiveVerification at the planner: what is rendered, what the acceptance counters then mean (no α, a
measured speedup), how SpeculationEffective is judged, and that K tuning and the schedule stand down."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.domain.releases import get_release, release_row
from speculator_operator.planning.tuning import applied, plan_tuning
from speculator_operator.render.serving import Draft, Inputs, RenderError, Tuned, render
from speculator_operator.telemetry.acceptance import Economics, acceptance_status, effective_condition
from speculator_operator.telemetry.vllm_metrics import Totals


def spec(**serving: Any) -> SpeculatorDeploymentSpec:
    return SpeculatorDeploymentSpec.model_validate({"verifier": {"model": "Qwen/Qwen3-8B"},
                                                    "speculator": {"source": "hf://acme/d"},
                                                    "serving": {"adaptiveVerification": True, **serving}})  # fmt: skip


def config(inputs: Inputs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    out = render(inputs)
    args = out.children[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    return json.loads(args[args.index("--speculative-config") + 1]), out.notes


def test_a_dspark_draft_is_served_adaptively_and_no_schedule_is_rendered_even_a_tuned_one() -> None:
    tuned = Tuned(8, ((1, 16, 8), (17, 256, 2)))
    got, notes = config(Inputs("d", "ns", spec(), get_release(), Draft("dspark", 8), "v" * 40, tuned=tuned))
    assert got["enable_adaptive_verification"] is True
    assert "num_speculative_tokens_per_batch_size" not in got
    assert got["num_speculative_tokens"] == 8
    assert [r for r, _ in notes] == ["AdaptiveVerification"]


@pytest.mark.parametrize(
    ("release", "algorithm", "why"),
    [
        ("2026.11-vllm0.32", "eagle3", "DSpark (and DFlash2 from 0.34) drafts only, not eagle3"),
        ("2026.11-vllm0.32", "dflash2", "adaptive verification of DFlash2 needs vLLM >= 0.34.0"),
    ],
)
def test_where_vllm_cannot_verify_adaptively_the_render_refuses_naming_why(
    release: str, algorithm: str, why: str
) -> None:
    with pytest.raises(RenderError, match=r"serving\.adaptiveVerification") as err:
        render(Inputs("d", "ns", spec(), release_row(release), Draft(algorithm, 7), "v" * 40))
    assert why in str(err.value)
    # vLLM 0.34 verifies DFlash2 adaptively as well
    got, _ = config(Inputs("d", "ns", spec(), release_row("2026.12-vllm0.34"), Draft("dflash2", 7), "v" * 40))
    assert got["enable_adaptive_verification"] is True


def test_an_offline_render_refuses_a_cutoff_beside_it_as_the_crd_does() -> None:
    with pytest.raises(RenderError, match=r"serving\.adaptiveVerification: .*serving\.cutoff"):
        render(Inputs("d", "ns", spec(cutoff={"maxBatchSize": 8}), get_release(), Draft("dspark", 8), "v" * 40))


def test_the_counters_then_give_no_alpha_and_the_speedup_is_measured_from_live_step_times() -> None:
    econ = Economics(k=7, algorithm="dspark", cost_ratio=0.15, max_k=7, source="prior",
                     plain_steps=((1.0, 10.0), (64.0, 20.0)))  # fmt: skip
    # 1000 drafts of 7 slots, 1500 tokens accepted (trimmed slots count as drafted, not accepted)
    totals = Totals(drafts=1000, draft_tokens=7000, accepted=1500, per_position=[600.0] * 7, itl_sum=12.0,
                    itl_count=1000, steps=1000, span=60, counted=1)  # fmt: skip
    acc = acceptance_status(totals, econ, revision="r", observed_at="t", min_samples=200, adaptive=True)
    assert acc.basis == "AdaptiveVerification"
    assert (acc.alpha, acc.break_even_alpha, acc.recommended_k) == (None, None, None)
    assert acc.mean_accepted_length == 2.5
    # 2.5 tokens a step of 12 ms where plain decoding takes 10 ms for one: 2.5 × 10 / 12
    assert acc.predicted_speedup == pytest.approx(2.083, abs=0.001)
    cond = effective_condition(acc, 1, 200)
    assert (cond.status, cond.reason) == ("True", "AboveBreakEven")
    # without a sweep on this device class nothing prices the step: Unknown, said as such
    blind = acceptance_status(totals, Economics(k=7, algorithm="dspark", cost_ratio=0.15, max_k=7), revision="r",
                              observed_at="t", min_samples=200, adaptive=True)  # fmt: skip
    assert blind.predicted_speedup is None
    assert (effective_condition(blind, 1, 200).status, effective_condition(blind, 1, 200).reason) == (
        "Unknown", "AdaptiveVerification",
    )  # fmt: skip
    # the same counters without adaptive verification describe the draft: α and a modelled speedup
    plain = acceptance_status(totals, econ, revision="r", observed_at="t", min_samples=200)
    assert plain.basis == "Drafts"
    assert plain.alpha is not None


def test_auto_tuning_stands_down_and_a_tuned_state_from_before_is_not_rendered() -> None:
    s = spec(tuning={"mode": "Auto", "minSamples": 10})
    econ = Economics(k=7, algorithm="dspark", cost_ratio=0.15, max_k=7)
    totals = Totals(drafts=1000, draft_tokens=7000, accepted=1500, per_position=[600.0] * 7, span=60, counted=1)
    acc = acceptance_status(totals, econ, revision="r", observed_at="t", min_samples=10, adaptive=True)
    planned = plan_tuning(s, None, acc, econ, 0.0, 10)
    assert planned.rollout is False
    assert planned.events == []
    assert planned.state is not None
    assert "adaptiveVerification" in (planned.state.note or "")
    from speculator_operator.api.deployment import TuningStatus

    before = TuningStatus.model_validate({"mode": "Auto", "k": 3, "schedule": [[1, 8, 3], [9, 256, 1]]})
    assert applied(s, before, 7) is None
