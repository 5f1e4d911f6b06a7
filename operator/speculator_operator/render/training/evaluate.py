"""The evaluate stage: the acceptance gate between the audit and the publish. Its vLLM server (role
`evaluator`) serves the verifier with the audited draft, its speculative config built in the pod from the
checkpoint itself (`speculator-operator serve --speculate`: method and K are the checkpoint's, read after
training); its client (`speculator-operator trainer evaluate`) sends the held-out prompts, or the spec's,
with fixed sampling and judges acceptance from vLLM's spec-decode counters.

Exit codes of the client (none is retried: each is the same on a second try): 3 acceptance or predicted
speedup below the spec's bound, 4 vLLM made no drafts, 5 the server was not ready within the stage's
timeout, 2 bad input."""

from __future__ import annotations

import json

from speculator_operator.api.podcontract import FAILED_EVALUATIONS, ExitCode
from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.render.serving import PORT, parallel_args
from speculator_operator.render.training import common
from speculator_operator.render.training.common import (
    HELD_OUT,
    VERIFIER,
    WORKSPACE,
    Inputs,
    Stage,
    final_checkpoint,
)

SWEEP_DIR = f"{WORKSPACE}/sweep"  # where the sweep's servers write their device and K (render/training/sweep.py)


def device_file(role: str) -> str:
    return f"{SWEEP_DIR}/{role}.device.json"


# the exit codes that fail the Job at once: bad usage, and each failed evaluation (no retry can change them)
FAIL_FAST = (int(ExitCode.USAGE), *(int(o.exit_code) for o in FAILED_EVALUATIONS))


def evaluate_stage(inputs: Inputs) -> Stage | None:
    ev = inputs.spec.evaluation
    if ev is None:
        return None
    command = [
        "speculator-operator", "trainer", "evaluate",
        "--endpoint", common.endpoint_of(inputs, "evaluator"),
        "--model", VERIFIER,
        "--checkpoint", final_checkpoint(inputs),
        "--verifier", VERIFIER,
        "--max-tokens", str(ev.max_tokens),
        "--temperature", str(ev.temperature),
        "--seed", str(ev.seed),
        "--concurrency", str(ev.concurrency),
        "--timeout", str(ev.timeout_seconds),
    ]  # fmt: skip
    if ev.prompts:
        command += ["--prompts-json", json.dumps(ev.prompts, ensure_ascii=False, separators=(",", ":"))]
    else:
        command += ["--prompts-file", HELD_OUT]
    if ev.num_speculative_tokens is not None:
        command += ["--k", str(ev.num_speculative_tokens)]
    if ev.min_acceptance is not None:
        command += ["--min-acceptance", str(ev.min_acceptance)]
    if ev.min_speedup is not None:
        command += ["--min-speedup", str(ev.min_speedup)]
    container = common.make_container(inputs.release.image("trainer"), command)
    job = common.make_job(inputs, "evaluate", inputs.spec.stages.cpu, container,
               fail_fast_codes=FAIL_FAST)  # fmt: skip
    job["spec"]["activeDeadlineSeconds"] = ev.timeout_seconds
    return Stage("evaluate", "Evaluating", [job], server="evaluator", command=command)


def evaluator_args(inputs: Inputs) -> list[str]:
    """`serve MODEL FLAGS...` of the evaluation server, without the speculative config (the pod adds it from
    the checkpoint). An mtp head stitched into the verifier is served as the target model itself; its
    served name stays the verifier's path, which the client asks for."""
    hs = inputs.spec.hidden_states
    model = final_checkpoint(inputs) if inputs.spec.algorithm == Algorithm.MTP.value else VERIFIER
    return [
        "serve", model,
        "--served-model-name", VERIFIER,
        "--host", "0.0.0.0",  # noqa: S104 - inside the pod; the Service is the way in
        "--port", str(PORT),
        "--tensor-parallel-size", str(hs.layout.tensor),
        *parallel_args(hs.layout),
        *hs.extra_args,
    ]  # fmt: skip


def evaluator_command(inputs: Inputs, role: str = "evaluator") -> list[str]:
    """The evaluation server's entrypoint: audit the checkpoint again where vLLM reads it, add the speculative
    config it calls for (K from the spec's evaluation, else the checkpoint's), exec vLLM. The sweep's servers
    (render/training/sweep.py) are the same with half the K, or without the speculative config (role sweeper-plain);
    with a sweep, each writes its device and K where the sweep's client reads them."""
    ev = inputs.spec.evaluation
    sweeping = ev is not None and ev.sweep is not None
    device = ["--device-file", device_file(role)] if sweeping else []
    if role == "sweeper-plain":
        return ["speculator-operator", "vllm", *device, "--", *evaluator_args(inputs)]
    command = ["speculator-operator", "serve", "--draft", final_checkpoint(inputs), "--verifier", VERIFIER,
               "--release", inputs.release.name, "--speculate", *device]  # fmt: skip
    if ev is not None and ev.num_speculative_tokens is not None:
        command += ["--num-speculative-tokens", str(ev.num_speculative_tokens)]
    if role == "sweeper-half":
        command.append("--half-k")
    return [*command, "--", *evaluator_args(inputs)]
