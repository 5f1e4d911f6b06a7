"""A SpeculatorDeployment serving a draft with a measured sweep in its provenance record (planning/measured.py): the
curve's schedule on the same device class, the parameter model elsewhere (said in status.economics), the precedence
numSpeculativeTokens > cutoff > Auto tuning > sweep > checkpoint, no schedule under data parallelism, and the
measured cost behind the acceptance figures and the tuning loop."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api.common import stored
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.domain.priors import PairSize
from speculator_operator.domain.releases import get_release
from speculator_operator.domain.sweep import PLAIN, Curve, Point
from speculator_operator.planning.deployment import Observed, plan
from speculator_operator.planning.measured import deployment_device, effective_cost, measured
from speculator_operator.telemetry.acceptance import economics_of

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint
from ..clock import NOW


def curve(rates: dict[int, dict[int, float]], device: str = "cpu", itl: dict[int, float] | None = None) -> Curve:
    """{K: {concurrency: tokens/s}}; ITL per K (ms) at every concurrency."""
    itl = itl or {k: 10.0 for k in rates}
    points = tuple(
        Point(k, c, 2 * c, round(rate * 10), 10.0, itl_ms=itl[k], running=float(c))
        for k, row in rates.items()
        for c, rate in row.items()
    )
    ks = tuple(sorted((k for k in rates if k), reverse=True))
    return Curve(device, ks, tuple(sorted({c for row in rates.values() for c in row})), points)


# K=3 pays at low load, not above: a schedule with plain decoding from the batch that c=16 ran
PAIR = PairSize(draft=150_000_000, shared_head=0, verifier=7_500_000_000)  # a parameter ratio of 0.02
STEPPED = curve(
    {
        3: {1: 30, 2: 55, 4: 80, 8: 100, 16: 60, 32: 80},
        2: {1: 25, 2: 50, 4: 90, 8: 120, 16: 90, 32: 120},
        PLAIN: {1: 10, 2: 20, 4: 40, 8: 80, 16: 160, 32: 320},
    },
    itl={3: 14.0, 2: 12.0, PLAIN: 10.0},
)
SLOWER = curve({3: {1: 9, 2: 18}, 2: {1: 9.5, 2: 19}, PLAIN: {1: 10, 2: 20}})


@pytest.fixture
def draft(tmp_path: Path) -> Any:
    write_checkpoint(tmp_path / "d", *eagle3())
    return audit(str(tmp_path / "d"), verifier=QWEN3_8B, release=get_release())


def with_sweep(report: Any, sweep: Curve | None) -> Any:
    record = {"job": "ml/train-q", "files": {}} | ({"sweep": sweep.wire()} if sweep else {})
    return replace(report, checkpoint=replace(report.checkpoint, provenance=record))


def spec(**serving: Any) -> SpeculatorDeploymentSpec:
    return SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B"},
            "speculator": {"source": "hf://acme/d"},
            "serving": {"deviceClass": "cpu", "maxNumSeqs": 64, **serving},
        }
    )


def served(
    s: SpeculatorDeploymentSpec, report: Any, status: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """(the speculative config rendered, the status written)."""
    obs = Observed(generation=1, status=SpeculatorDeploymentStatus.model_validate(status or {}), verifier_revision="v",
                   audit=report, pair=PAIR)  # fmt: skip
    p = plan("q", "ns", "uid", s, get_release(), obs, now=NOW)
    assert p.children is not None
    (c,) = p.children[0]["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    config = json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None
    return config, stored(p.status)


def test_the_same_device_class_serves_the_measured_schedule(draft: Any) -> None:
    config, status = served(spec(), with_sweep(draft, STEPPED))
    assert config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 3, 3], [4, 15, 2], [16, 64, 0]]
    econ = status["economics"]
    assert econ["source"] == "sweep"
    assert econ["scheduleFrom"] == "sweep"
    assert econ["sweep"] == {"job": "ml/train-q", "device": "cpu", "digest": STEPPED.digest()}
    assert econ["effectiveCostRatio"] == pytest.approx(0.4 / 3, abs=1e-6)  # ITL 14 ms vs 10 ms, 3 draft forwards
    assert econ["parameterRatio"] < econ["effectiveCostRatio"]  # the parameter ratio stays, for comparison
    assert (econ["prior"], econ["costRatio"]) == ("cpu", econ["parameterRatio"])  # on a CPU the prior is that ratio
    assert "note" not in econ


def test_another_device_class_falls_back_to_the_model_and_says_so(draft: Any) -> None:
    config, status = served(spec(deviceClass="NVIDIA H100 80GB HBM3"), with_sweep(draft, STEPPED))
    assert config["num_speculative_tokens"] == 3  # the checkpoint's K at every batch size, as before
    assert "num_speculative_tokens_per_batch_size" not in config
    econ = status["economics"]
    assert (econ["source"], econ["scheduleFrom"], econ["prior"]) == ("prior", "checkpoint", "h100")
    assert econ["costRatio"] > econ["parameterRatio"]  # a GPU forward is latency-bound
    assert "ran on cpu" in econ["note"]
    assert "nvidia-h100-80gb-hbm3" in econ["note"]
    assert "effectiveCostRatio" not in econ


def test_a_draft_without_a_sweep_renders_as_before(draft: Any) -> None:
    config, status = served(spec(), with_sweep(draft, None))
    assert config == served(spec(), draft)[0]
    assert "num_speculative_tokens_per_batch_size" not in config
    assert (status["economics"]["source"], status["economics"]["prior"]) == ("prior", "cpu")
    assert "sweep" not in status["economics"]


@pytest.mark.parametrize(
    ("serving", "status", "schedule_from", "k", "schedule"),
    [
        ({"numSpeculativeTokens": 2}, None, "numSpeculativeTokens", 2, None),
        ({"cutoff": {"maxBatchSize": 8}}, None, "cutoff", 3, [[1, 8, 3], [9, 64, 0]]),
        ({"tuning": {"mode": "Auto"}}, {"tuning": {"mode": "Auto", "k": 2, "schedule": [[1, 4, 2], [5, 64, 1]]}},
         "tuning", 2, [[1, 4, 2], [5, 64, 1]]),
        ({"tuning": {"mode": "Auto"}}, None, "sweep", 3, [[1, 3, 3], [4, 15, 2], [16, 64, 0]]),
        ({}, None, "sweep", 3, [[1, 3, 3], [4, 15, 2], [16, 64, 0]]),
    ],
)  # fmt: skip
def test_the_precedence_order(
    draft: Any,
    serving: dict[str, Any],
    status: dict[str, Any] | None,
    schedule_from: str,
    k: int,
    schedule: list[list[int]] | None,
) -> None:
    config, written = served(spec(**serving), with_sweep(draft, STEPPED), status)
    assert written["economics"]["scheduleFrom"] == schedule_from
    assert config["num_speculative_tokens"] == k
    assert config.get("num_speculative_tokens_per_batch_size") == schedule
    assert written["economics"]["source"] == "sweep"  # the measured cost stands whatever set K


def test_a_sweep_where_plain_decoding_always_wins_serves_without_speculation(draft: Any) -> None:
    config, status = served(spec(), with_sweep(draft, SLOWER))
    assert config is None
    notes = {n["reason"]: n["message"] for n in status["renderNotes"]}
    assert "measured sweep found plain decoding" in notes["SpeculationOff"]
    assert status["numSpeculativeTokens"] == 0
    # the user's K still wins over the measurement
    config, _ = served(spec(numSpeculativeTokens=3), with_sweep(draft, SLOWER))
    assert config["num_speculative_tokens"] == 3


def test_data_parallelism_renders_no_schedule(draft: Any) -> None:
    config, status = served(spec(parallelism={"data": 2}), with_sweep(draft, STEPPED))
    assert "num_speculative_tokens_per_batch_size" not in config
    assert "ScheduleOff" in {n["reason"] for n in status["renderNotes"]}


def test_the_device_class_of_a_deployment() -> None:
    def of(serving: dict[str, Any]) -> str | None:
        return deployment_device(spec(**serving))

    assert of({"deviceClass": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3"
    selector = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert of({"deviceClass": None, "nodeSelector": selector}) == "nvidia-h100-80gb-hbm3"
    assert of({"deviceClass": None, "resources": {"limits": {"nvidia.com/gpu": 0}}}) == "cpu"
    assert of({"deviceClass": None}) is None  # a GPU of no known kind: a sweep is not used


def test_the_acceptance_figures_and_tuning_use_the_measured_cost() -> None:
    status = SpeculatorDeploymentStatus.model_validate(
        {
            "numSpeculativeTokens": 3,
            "algorithm": "eagle3",
            "economics": {"costRatio": 0.02, "effectiveCostRatio": 0.13, "maxK": 3, "source": "sweep"},
        }
    )
    econ = economics_of(status)
    assert econ is not None
    assert econ.cost_ratio == 0.13
    assert effective_cost(SLOWER, "eagle3") == 0.0  # equal step times: no measurable draft cost


def test_speculation_off_by_the_sweep_says_so_in_the_condition() -> None:
    from speculator_operator.api.deployment import PairEconomics, TuningStatus
    from speculator_operator.telemetry.acceptance import disabled_condition

    swept = PairEconomics(schedule_from="sweep")
    measured = disabled_condition(1, None, swept)
    assert (measured.status, measured.reason) == ("False", "SpeculationDisabled")
    assert "measured sweep" in measured.message
    # Auto tuning's own switch-off (it has tuned K to 0) is said as tuning's, with its probe
    tuned = disabled_condition(1, TuningStatus(mode="Auto", k=0, probe_at="2026-12-06T10:00:00Z"), swept)
    assert "probe revision" in tuned.message


def test_under_adaptive_verification_a_sweep_sets_neither_k_nor_schedule() -> None:
    """vLLM decides per step how much of the draft to verify: a sweep's static K (0 included) must not replace the
    checkpoint's, and its schedule is not rendered; the measured cost still stands."""
    adaptive = spec(adaptiveVerification=True)
    found = measured(adaptive, get_release(), {"job": "ml/train-q", "sweep": STEPPED.wire()}, "dspark", 3, None)
    assert found.tuned is None
    assert found.economics["schedule_from"] == "adaptiveVerification"
    assert found.economics["source"] == "sweep"
    plain = measured(spec(), get_release(), {"job": "ml/train-q", "sweep": STEPPED.wire()}, "dspark", 3, None)
    assert plain.tuned is not None  # the same sweep without adaptive verification sets K and the schedule
