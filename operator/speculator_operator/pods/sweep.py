"""The sweep's client, inside the trainer image: one server lifetime's points of the throughput-versus-interactivity
sweep (domain/sweep.py). The stage machine starts the server (the evaluated K, ⌈K/2⌉, or plain) and this client:

- waits for it and reads the device and K it serves from the file its entrypoint wrote (pods/device.py), refusing a
  server that serves another K than this stage measures;
- sends one request to warm it up (not counted), then for each concurrency c sends rounds × c requests from c
  closed-loop clients (fixed sampling, EOS ignored, so every request generates exactly --max-tokens);
- reads vLLM's counters before and after each point: generated tokens, the inter-token latency histogram (vLLM
  observes it once per engine step per request, so its mean is the step time a request sees), the engine steps
  (`vllm:iteration_tokens_total`'s count: the mean batch is ITL observations per step) and the spec-decode counters;
- checks the point is consistent (the completions counted rounds × c × max-tokens, and vLLM counted the same tokens)
  and reports the points (`sweep` in the stage report). A point that cannot be measured ends the stage with exit 6,
  naming the K and the concurrency it reached; the points before it are reported as not whole.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from speculator_operator.adapters.checkpoints import checkpoint_dir, load_checkpoint
from speculator_operator.api.podcontract import ExitCode
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.sweep import Point
from speculator_operator.pods.device import read_device_file
from speculator_operator.pods.evaluate import complete, http_get, load_prompts, wait_ready
from speculator_operator.pods.holdout import EvaluationError
from speculator_operator.pods.trainer.report import report
from speculator_operator.render.serving import RenderError, draft_of

GENERATED = "vllm:generation_tokens_total"
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
STEPS = "vllm:iteration_tokens_total_count"
DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
READ = (GENERATED, ITL_SUM, ITL_COUNT, STEPS, DRAFTS, ACCEPTED)


class SweepFailed(Exception):
    """A point could not be measured: `at` is the point ({k, concurrency}) where that is known."""

    def __init__(self, message: str, at: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.at = at


def read_counters(endpoint: str) -> dict[str, float]:
    """The counters a point reads (summed over engines and label sets); the absent ones are 0."""
    code, text = http_get(f"{endpoint}/metrics")
    if code != 200:
        raise SweepFailed(f"GET {endpoint}/metrics answered {code or 'nothing'}")
    out = dict.fromkeys(READ, 0.0)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in out:
                    out[s.name] += float(s.value)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SweepFailed(f"{endpoint}/metrics is not Prometheus text: {str(exc)[:200]}") from None
    return out


def settled(endpoint: str, deadline: float) -> dict[str, float]:
    """The counters once two reads half a second apart agree (vLLM records a step's stats after answering)."""
    last = read_counters(endpoint)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        cur = read_counters(endpoint)
        if cur == last:
            return cur
        last = cur
    return last


@dataclass(frozen=True)
class Plan:
    k: int  # the K this server serves (0: plain)
    concurrencies: list[int]
    rounds: int
    max_tokens: int
    seed: int


def served_k(label: str, checkpoint: str, k: int | None) -> int:
    """The K a sweep stage measures: the evaluated K, half of it rounded up, or 0."""
    if label == "plain":
        return 0
    full = k or draft_of(load_checkpoint(str(checkpoint_dir(Path(checkpoint))))).speculative_tokens
    return full if label == "k" else math.ceil(full / 2)


def measure(endpoint: str, model: str, prompts: list[Any], plan: Plan, deadline: float, points: list[Point]) -> None:
    """Every point of one server lifetime, in order, appended to `points`; SweepFailed names the point it could not
    measure (the points before it stay in `points`)."""
    sampling = {"model": model, "max_tokens": plan.max_tokens, "temperature": 0.0, "seed": plan.seed,
                "ignore_eos": True}  # fmt: skip

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SweepFailed("sweep.timeoutSeconds ran out")
        return remaining

    c = plan.concurrencies[0]
    try:
        # one request to warm the server up (its first request compiles and allocates), not counted
        complete(endpoint, {**sampling, "prompt": prompts[0]}, left())
        settled(endpoint, min(deadline, time.monotonic() + 30))
        for c in plan.concurrencies:
            n = plan.rounds * c
            before = read_counters(endpoint)
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=c) as pool:
                bodies = [{**sampling, "prompt": prompts[i % len(prompts)]} for i in range(n)]
                tokens = sum(pool.map(lambda body: complete(endpoint, body, left()), bodies))
            seconds = time.monotonic() - t0
            after = settled(endpoint, min(deadline, time.monotonic() + 30))
            points.append(_point(plan, c, n, tokens, seconds, before, after))
    except (SweepFailed, EvaluationError, OSError) as exc:
        raise SweepFailed(f"at K={plan.k}, concurrency {c}: {exc}", {"k": plan.k, "concurrency": c}) from None


def _point(
    plan: Plan, c: int, n: int, tokens: int, seconds: float, before: dict[str, float], after: dict[str, float]
) -> Point:
    delta = {name: after[name] - before[name] for name in READ}
    if tokens != n * plan.max_tokens:
        raise SweepFailed(f"the completions counted {tokens} tokens, not {n} × {plan.max_tokens}")
    if round(delta[GENERATED]) != tokens:
        raise SweepFailed(f"vLLM counted {delta[GENERATED]:.0f} generated tokens, the completions {tokens}")
    itl = delta[ITL_SUM] / delta[ITL_COUNT] * 1000 if delta[ITL_COUNT] > 0 else None
    running = delta[ITL_COUNT] / delta[STEPS] if delta[STEPS] > 0 and delta[ITL_COUNT] > 0 else None
    speculative = plan.k > 0
    return Point(
        plan.k, c, n, tokens, seconds, itl, running,
        drafts=round(delta[DRAFTS]) if speculative else None,
        accepted=round(delta[ACCEPTED]) if speculative else None,
    )  # fmt: skip


def _fail(
    label: str, k: int | None, device: str | None, points: list[Point], message: str, where: dict[str, int]
) -> int:
    print(f"sweep: failed {message}", file=sys.stderr)
    body = {"label": label, "k": k, "device": device, "failedAt": where, "points": [p.wire() for p in points]}
    report("sweep", sweep={k: v for k, v in body.items() if v is not None}, message=f"sweep {message}")
    return int(ExitCode.SWEEP_FAILED)


def main(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    endpoint = args.endpoint.rstrip("/")
    try:
        prompts = load_prompts(args.prompts_file, args.prompts_json)
        k = served_k(args.label, args.checkpoint, args.k)
        cs = [int(c) for c in args.concurrencies.split(",")]
    except (EvaluationError, CheckpointError, RenderError, ValueError) as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    plan = Plan(k, cs, args.rounds, args.max_tokens, args.seed)
    first = {"k": k, "concurrency": cs[0]}
    if not wait_ready(endpoint, deadline):
        return _fail(args.label, k, None, [], f"at K={k}: the server {endpoint} was not ready in time", first)
    found = read_device_file(args.device_file)
    if found is None:
        return _fail(args.label, k, None, [], f"at K={k}: the server wrote no device file {args.device_file}", first)
    device, server_k = found
    if server_k != k:
        return _fail(args.label, k, device, [], f"at K={k}: the server serves K={server_k}", first)
    print(f"sweep: {args.label}: K={k} on {device}, concurrencies {cs}, {args.rounds} round(s)", file=sys.stderr)
    points: list[Point] = []
    try:
        measure(endpoint, args.model, prompts, plan, deadline, points)
    except SweepFailed as exc:
        return _fail(args.label, k, device, points, str(exc), exc.at or first)
    for p in points:
        print(json.dumps(p.wire(), sort_keys=True), flush=True)
    report("sweep", sweep={"label": args.label, "k": k, "device": device, "points": [p.wire() for p in points]})
    return int(ExitCode.OK)
