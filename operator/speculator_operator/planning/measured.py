"""A SpeculatorDeployment's K and schedule from the draft's measured sweep (domain/sweep.py), and the precedence that
decides what is served (docs/concepts/sweep.md):

    numSpeculativeTokens > cutoff > Auto tuning (its K and schedule) > the measured sweep > the checkpoint's K

The sweep is the one in the draft's published provenance record (`sweep`, written by the train job's publish). It is
used only where the deployment runs on the device class it ran on: `serving.deviceClass`, else the node selector's
`nvidia.com/gpu.product`, else `cpu` where the pods ask for no GPU. Elsewhere the device class prior
(domain/priors.py) stays and `status.economics.note` says why. Under data parallelism the render drops any schedule
(ScheduleOff).

The sweep also gives the draft's effective cost: at one request, a step with K drafted tokens takes
T_K = T_0 · (1 + n·c) (n the draft forwards per step), so c = (T_K / T_0 − 1) / n from vLLM's inter-token latency,
which vLLM observes once per step per request. It replaces the prior's cost behind breakEvenAlpha,
predictedSpeedup and recommendedK (`status.economics.source: sweep`) until live step times take over: the scrape
compares the window's step time with the sweep's plain step time at the same batch (`plain_steps`) and, once it has
enough drafts, writes that cost (`source: live`, telemetry/acceptance.py `live_cost`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speculator_operator.api.deployment import PairEconomics, SpeculatorDeploymentSpec, SweepRef
from speculator_operator.domain.economics import draft_forwards
from speculator_operator.domain.releases import Release
from speculator_operator.domain.sweep import PLAIN, Curve, SweepError, choose, device_class, plain_steps
from speculator_operator.render.serving import GPU, Tuned

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery's node label


def deployment_device(spec: SpeculatorDeploymentSpec) -> str | None:
    """The device class the replicas run on, where the spec says or implies it (None: not known)."""
    s = spec.serving
    if s.device_class:
        return device_class(s.device_class)
    product = (s.node_selector or {}).get(GPU_PRODUCT_LABEL)
    if product:
        return device_class(product)
    gpus = {str(v) for part in (s.resources or {}).values() for k, v in part.items() if k == GPU}
    if gpus == {"0"} or (not gpus and s.layout.gpus_per_pod == 0):
        return "cpu"
    return None


def effective_cost(curve: Curve, algorithm: str) -> float | None:
    """c from the sweep's step times at the lowest concurrency, with its largest K (None without step times)."""
    if not curve.ks:
        return None
    k, c = curve.ks[0], curve.concurrencies[0]
    spec_itl, plain_itl = curve.at(k, c).itl_ms, curve.at(PLAIN, c).itl_ms
    if not spec_itl or not plain_itl:
        return None
    return max(0.0, (spec_itl / plain_itl - 1.0) / draft_forwards(algorithm, k))


@dataclass(frozen=True)
class Measured:
    tuned: Tuned | None  # what the sweep says to serve, where the precedence leaves it to the sweep
    economics: dict[str, Any]  # PairEconomics fields (Python names) this adds to status.economics


def _curve(provenance: dict[str, Any] | None) -> tuple[Curve | None, str | None]:
    raw = (provenance or {}).get("sweep")
    if raw is None:
        return None, None
    try:
        return Curve.from_wire(raw), None
    except SweepError as exc:
        return None, f"the draft's provenance record has a sweep this operator cannot use: {exc}"


def measured(
    spec: SpeculatorDeploymentSpec,
    release: Release,
    provenance: dict[str, Any] | None,
    algorithm: str,
    max_k: int,
    tuned: Tuned | None,
) -> Measured:
    """What the draft's sweep decides for this deployment (`tuned`: what Auto tuning already decided, if anything)."""
    s = spec.serving
    if s.adaptive_verification:  # vLLM verifies per step: no schedule or K is chosen here, a sweep's included
        schedule_from = "adaptiveVerification"
    elif s.num_speculative_tokens != "auto":
        schedule_from = "numSpeculativeTokens"
    elif s.cutoff is not None:
        schedule_from = "cutoff"
    elif tuned is not None:
        schedule_from = "tuning"
    else:
        schedule_from = "checkpoint"
    curve, problem = _curve(provenance)
    here = deployment_device(spec)
    econ: dict[str, Any] = {"schedule_from": schedule_from}  # the source stays the pair's (the prior) unless measured
    if curve is None:
        return Measured(None, {**econ, "note": problem})
    ref = SweepRef(job=str((provenance or {}).get("job") or "") or None, device=curve.device, digest=curve.digest())
    if here != curve.device:
        where = f"on {here}" if here else "on a device class it does not know (set serving.deviceClass)"
        note = f"the draft's sweep ran on {curve.device}; this deployment runs {where}: the device class prior stands"
        return Measured(None, {**econ, "sweep": ref, "note": note})
    cost = effective_cost(curve, algorithm)
    econ = {**econ, "sweep": ref}
    if cost is not None:
        econ["source"], econ["effective_cost_ratio"] = "sweep", round(cost, 6)
    steps = plain_steps(curve)
    if steps:
        econ["plain_steps"] = [list(p) for p in steps]
    if schedule_from != "checkpoint":
        return Measured(None, econ)
    choice = choose(curve, s.max_num_seqs, max_k, release.schedule_cost)
    schedule = choice.schedule.ranges if choice.schedule is not None else None
    return Measured(Tuned(choice.k, schedule, source="sweep"), {**econ, "schedule_from": "sweep"})


def with_measured(base: PairEconomics, found: Measured, current: PairEconomics | None) -> PairEconomics:
    """status.economics: the pair's, what the sweep adds, and the live cost the telemetry measured against this same
    sweep (it stands until the draft's sweep changes: the scrape refreshes it on a material change)."""
    out = base.model_copy(update={k: v for k, v in found.economics.items() if v is not None})
    if (
        current is not None
        and current.source == "live"
        and current.effective_cost_ratio is not None
        and out.source == "sweep"
        and current.sweep == out.sweep
    ):
        out = out.model_copy(update={"source": "live", "effective_cost_ratio": current.effective_cost_ratio})
    return out
