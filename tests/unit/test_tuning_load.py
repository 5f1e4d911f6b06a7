"""The schedule under load, end to end through the planners: the deployment planner prices the pair with its device
class prior and writes that row's load model to status.economics.loadModel; the scrape reads it back
(telemetry.acceptance.economics_of) and Auto tuning prices its per-batch-size schedule with it; a CPU keeps the
saturation model (serving.tuning.saturationTokens); a measured sweep's curve and cost keep their precedence."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api.common import stored
from speculator_operator.api.deployment import (
    Acceptance,
    SpeculatorDeploymentSpec,
    SpeculatorDeploymentStatus,
    TuningStatus,
)
from speculator_operator.domain.economics import cutoff_schedule
from speculator_operator.domain.priors import pair_load, pair_size
from speculator_operator.domain.releases import get_release
from speculator_operator.domain.sweep import PLAIN, Curve, Point
from speculator_operator.planning.deployment import Observed, plan
from speculator_operator.planning.tuning import candidate, iso, plan_tuning
from speculator_operator.telemetry.acceptance import Economics, economics_of

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint
from ..clock import NOW

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # GPU feature discovery's label on an H100 node
T0 = 1_800_000_000.0
ALPHA = 0.2  # K=1 beats the checkpoint's K=3 by more than the hysteresis, whichever cost prices the draft here


@pytest.fixture
def draft(tmp_path: Path) -> Any:
    write_checkpoint(tmp_path / "d", *eagle3())  # K=3, an EAGLE-3 head on Qwen3-8B
    return audit(str(tmp_path / "d"), verifier=QWEN3_8B, release=get_release())


def spec(**serving: Any) -> SpeculatorDeploymentSpec:
    return SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B"},
            "speculator": {"source": "hf://acme/d"},
            "serving": {"tuning": {"mode": "Auto", "minIntervalSeconds": 30}, **serving},
        }
    )


def planned(s: SpeculatorDeploymentSpec, report: Any, status: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(the speculative config rendered, the status written) by one pass of the deployment planner, the pair sized
    from the draft's header and the verifier's config as the controller does."""
    obs = Observed(
        generation=1,
        status=SpeculatorDeploymentStatus.model_validate(status or {}),
        verifier_revision="v",
        audit=report,
        pair=pair_size(report.checkpoint.drafting_shapes, QWEN3_8B),
    )
    p = plan("q", "ns", "uid", s, get_release(), obs, now=NOW)
    assert p.children is not None
    (c,) = p.children[0]["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    config = json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None
    return config, p.status


def tuned(s: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus) -> tuple[Economics, TuningStatus]:
    """The scrape's view of the served pair and the status.tuning Auto writes once the evidence has held."""
    econ = economics_of(status)
    assert econ is not None
    best, _, _ = candidate(s, ALPHA, econ, econ.cost_ratio or 0.0)
    assert best not in (0, econ.k)
    held = TuningStatus.model_validate({"mode": "Auto", "pending": {"k": best, "since": iso(T0)}})
    p = plan_tuning(s, held, Acceptance(alpha=ALPHA, drafts=1000), econ, T0 + 60, 200)
    assert p.rollout
    assert p.state is not None
    assert p.state.k == best
    return econ, p.state


def test_an_h100_deployment_gets_its_schedule_from_the_device_class_load_model(draft: Any) -> None:
    s = spec(nodeSelector=H100)
    _, status = planned(s, draft)
    econ_status = stored(status)["economics"]
    assert (econ_status["prior"], econ_status["source"]) == ("h100", "prior")
    # the load model written is the prior row's, for this pair
    size = pair_size(draft.checkpoint.drafting_shapes, QWEN3_8B)
    assert size is not None
    assert size.kv_bytes == 2 * 36 * 8 * 128 * 2  # K and V, 36 layers, 8 KV heads of 128, BF16
    expected = pair_load(size, "nvidia-h100-80gb-hbm3")
    assert expected is not None
    econ, state = tuned(s, status)
    assert econ.load is not None
    for field, value in vars(expected).items():
        assert getattr(econ.load, field) == pytest.approx(value, rel=1e-5), field
    k, c = state.k, econ.cost_ratio
    assert k is not None
    assert c is not None
    seqs = s.serving.max_num_seqs
    by_load = cutoff_schedule(ALPHA, c, k, seqs, algorithm="eagle3", load=econ.load).as_list()
    saturated = cutoff_schedule(ALPHA, c, k, seqs, s.serving.tuning.saturation_tokens, "eagle3").as_list()
    assert state.schedule == by_load
    assert by_load != saturated  # the change is real: the saturation model would have served another schedule
    assert [r[2] for r in by_load] == sorted((r[2] for r in by_load), reverse=True)
    assert by_load[-1][2] < k
    # the next pass renders what was tuned
    config, after = planned(s, draft, {**stored(status), "tuning": stored(state)})
    assert config["num_speculative_tokens"] == k
    assert config["num_speculative_tokens_per_batch_size"] == by_load
    assert stored(after)["economics"]["scheduleFrom"] == "tuning"


def test_an_unknown_gpu_gets_the_default_row_and_a_cpu_the_saturation_model(draft: Any) -> None:
    # a GPU of no known kind: the default row's load model
    _, status = planned(spec(), draft)
    assert stored(status)["economics"]["prior"] == "default"
    assert "loadModel" in stored(status)["economics"]
    # a CPU: no load model; Auto's schedule is the saturation model's, at the spec's saturationTokens
    gpu = stored(status)
    s = spec(deviceClass="cpu", tuning={"mode": "Auto", "minIntervalSeconds": 30, "saturationTokens": 128})
    _, status = planned(s, draft, gpu)  # the spec moved to a CPU: the GPU's load model goes with it
    econ_status = stored(status)["economics"]
    assert econ_status["prior"] == "cpu"
    assert "loadModel" not in econ_status
    econ, state = tuned(s, status)
    assert econ.load is None
    k, c = state.k, econ.cost_ratio
    assert k is not None
    assert c is not None
    expected = cutoff_schedule(ALPHA, c, k, s.serving.max_num_seqs, 128, "eagle3").as_list()
    assert len(expected) > 1
    assert state.schedule == expected


def test_a_measured_sweep_keeps_its_precedence_on_the_gpu_it_ran_on(draft: Any) -> None:
    # a sweep measured on an H100: the curve's schedule is served, not the load model's
    sweep = Curve(
        "nvidia-h100-80gb-hbm3",
        (3, 2),
        (1, 2, 4, 8, 16, 32),
        tuple(
            Point(k, c, 2 * c, round(rate * 10), 10.0, itl_ms=itl, running=float(c))
            for k, itl, row in (
                (3, 14.0, {1: 30, 2: 55, 4: 80, 8: 100, 16: 60, 32: 80}),
                (2, 12.0, {1: 25, 2: 50, 4: 90, 8: 120, 16: 90, 32: 120}),
                (PLAIN, 10.0, {1: 10, 2: 20, 4: 40, 8: 80, 16: 160, 32: 320}),
            )
            for c, rate in row.items()
        ),
    )
    swept = replace(draft, checkpoint=replace(draft.checkpoint, provenance={"job": "ml/t", "sweep": sweep.wire()}))
    s = spec(nodeSelector=H100, maxNumSeqs=64)
    config, status = planned(s, swept)
    econ_status = stored(status)["economics"]
    assert (econ_status["source"], econ_status["scheduleFrom"]) == ("sweep", "sweep")
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 3, 3], [4, 15, 2], [16, 64, 0]]
    assert "loadModel" in econ_status  # kept for the tuning that may follow
    # once Auto tunes, the draft's cost is the sweep's measured one; the load model only says how the steps grow
    econ, state = tuned(s, status)
    assert econ.cost_ratio == pytest.approx(econ_status["effectiveCostRatio"])
    assert econ.cost_ratio != econ_status["costRatio"]
    k, c = state.k, econ.cost_ratio
    assert k is not None
    assert c is not None
    assert econ.load is not None
    expected = cutoff_schedule(ALPHA, c, k, 64, algorithm="eagle3", load=econ.load).as_list()
    assert len(expected) > 1
    assert state.schedule == expected
