"""The sweep stages (spec.evaluation.sweep): after the acceptance gate, one stage per K, each with a server lifetime of
its own, in order: `sweep-k` on the evaluation server itself (the evaluated K: the server stays up from the evaluate
stage), `sweep-half` on `NAME-sweeper-half` with ⌈K/2⌉ (left out where that is K itself: K = 1), `sweep-plain` on
`NAME-sweeper-plain` without a speculative config. Each server is the evaluation server's rendering with only K changed
(or the speculative config left out); its entrypoint writes the device and the K it serves into the workspace for the
client (`speculator-operator trainer sweep`, pods/sweep.py), which never runs vLLM itself. The stage machine runs one
server at a time (planning/trainjob.py); the planner assembles the curve from the three reports (domain/sweep.py)."""

from __future__ import annotations

import json

from speculator_operator.api.podcontract import ExitCode
from speculator_operator.domain.sweep import concurrencies
from speculator_operator.render.training import common
from speculator_operator.render.training.common import HELD_OUT, VERIFIER, Inputs, Stage, final_checkpoint
from speculator_operator.render.training.evaluate import device_file

# (stage, its label for the client, the server role it talks to)
SWEEP_STAGES = (("sweep-k", "k", "evaluator"), ("sweep-half", "half", "sweeper-half"),
                ("sweep-plain", "plain", "sweeper-plain"))  # fmt: skip
# the servers' roles differ from the stages' names: both are a pod's speculators.dev/stage label, and a server's
# Service must never select its client's pod
SWEEP_ROLES = ("sweeper-half", "sweeper-plain")
FAIL_FAST = (int(ExitCode.USAGE), int(ExitCode.SWEEP_FAILED))  # a retry would measure on another server lifetime


def evaluated_k(inputs: Inputs) -> int | None:
    """The evaluated K where it is known before the sweep: the spec's, else what the evaluate stage reported."""
    ev = inputs.spec.evaluation
    if ev is not None and ev.num_speculative_tokens is not None:
        return ev.num_speculative_tokens
    k = (inputs.evaluation or {}).get("k")
    return k if isinstance(k, int) else None


def sweep_concurrencies(inputs: Inputs) -> list[int]:
    ev = inputs.spec.evaluation
    assert ev is not None
    assert ev.sweep is not None
    prompts = len(ev.prompts) if ev.prompts else ev.held_out
    return concurrencies(ev.sweep.max_concurrency, prompts)


def sweep_stages(inputs: Inputs) -> list[Stage]:
    ev = inputs.spec.evaluation
    if ev is None or ev.sweep is None:
        return []
    out = []
    for name, label, role in SWEEP_STAGES:
        if label == "half" and evaluated_k(inputs) == 1:
            continue  # ⌈1/2⌉ = 1: the sweep-k stage measured it
        command = [
            "speculator-operator", "trainer", "sweep",
            "--endpoint", common.endpoint_of(inputs, role),
            "--model", VERIFIER,
            "--checkpoint", final_checkpoint(inputs),
            "--label", label,
            "--device-file", device_file(role),
            "--concurrencies", ",".join(str(c) for c in sweep_concurrencies(inputs)),
            "--rounds", str(ev.sweep.rounds),
            "--max-tokens", str(ev.max_tokens),
            "--seed", str(ev.seed),
            "--timeout", str(ev.sweep.timeout_seconds),
        ]  # fmt: skip
        if ev.num_speculative_tokens is not None:
            command += ["--k", str(ev.num_speculative_tokens)]
        if ev.prompts:
            command += ["--prompts-json", json.dumps(ev.prompts, ensure_ascii=False, separators=(",", ":"))]
        else:
            command += ["--prompts-file", HELD_OUT]
        container = common.make_container(inputs.release.image("trainer"), command)
        job = common.make_job(inputs, name, inputs.spec.stages.cpu, container, fail_fast_codes=FAIL_FAST)
        job["spec"]["activeDeadlineSeconds"] = ev.sweep.timeout_seconds
        out.append(Stage(name, "Sweeping", [job], server=role, command=command))
    return out
