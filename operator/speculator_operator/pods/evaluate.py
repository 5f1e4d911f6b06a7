"""The evaluate stage's client, inside the trainer image: it measures a draft's acceptance in the pinned vLLM
before the draft is published (the held-out prompts it sends come from pods/holdout.py).

- `trainer evaluate`: wait for the evaluation server (within the stage's timeout), read vLLM's
  spec-decode counters, send every prompt with fixed sampling (EOS ignored, so each request generates
  exactly --max-tokens), read the counters again once they have settled, and judge the increase with the
  telemetry code (telemetry/vllm_metrics.py, telemetry/acceptance.py): acceptance rate, mean accepted length,
  alpha, the predicted speedup from the draft/verifier cost ratio. The numbers are the stage's report, on failure too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speculator_operator.adapters.checkpoints import checkpoint_dir, load_checkpoint, load_verifier_config
from speculator_operator.api.common import stored
from speculator_operator.api.podcontract import EvaluationOutcome, ExitCode
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.economics import pair_cost_ratio
from speculator_operator.pods.holdout import EvaluationError
from speculator_operator.pods.trainer.report import report
from speculator_operator.render.serving import RenderError, draft_of
from speculator_operator.telemetry.acceptance import Economics, acceptance_status
from speculator_operator.telemetry.vllm_metrics import MetricsError, Sample, Totals, increment, parse_sample

BELOW = EvaluationOutcome.BELOW_THRESHOLD
ZERO = EvaluationOutcome.ZERO_DRAFTS
NOT_READY = EvaluationOutcome.SERVER_NOT_READY


def load_prompts(path: str | None, given: str | None) -> list[str | list[int]]:
    """The prompts: the spec's (a JSON list of strings) or the held-out file's (token ids or text)."""
    out: list[str | list[int]] = []
    if given is not None:
        try:
            value = json.loads(given)
        except ValueError as exc:
            raise EvaluationError(f"--prompts-json is not JSON: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise EvaluationError("--prompts-json must be a list of non-empty strings")
        out = list(value)
    elif path is not None:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise EvaluationError(f"cannot read the held-out prompts: {exc}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise EvaluationError(f"{path}:{n}: not JSON") from None
            ids, text = row.get("prompt_token_ids"), row.get("prompt")
            if isinstance(ids, list) and ids and all(isinstance(t, int) and t >= 0 for t in ids):
                out.append(ids)
            elif isinstance(text, str) and text:
                out.append(text)
            else:
                raise EvaluationError(f"{path}:{n}: neither prompt_token_ids nor prompt")
    if not out:
        raise EvaluationError("no prompts to evaluate")
    return out


# ---- the judgement ------------------------------------------------------------------------------------


def judge(measured: dict[str, Any], min_acceptance: float | None, min_speedup: float | None) -> tuple[str, str, int]:
    """(outcome, message, exit code) of a measurement (`acceptance_status`'s fields)."""
    drafts = measured.get("drafts") or 0
    if drafts <= 0:
        return ZERO, "vLLM made no drafts over the evaluated requests: it served without speculation", ZERO.exit_code
    rate = measured.get("rate")
    if min_acceptance is not None and (rate is None or rate < min_acceptance):
        return BELOW, f"acceptance {rate} is below evaluation.minAcceptance {min_acceptance}", BELOW.exit_code
    predicted = measured.get("predictedSpeedup")
    if min_speedup is not None and (predicted is None or predicted < min_speedup):
        why = "unknown (the verifier's config gives no cost ratio)" if predicted is None else str(predicted)
        return BELOW, f"predicted speedup {why} is below evaluation.minSpeedup {min_speedup}", BELOW.exit_code
    return EvaluationOutcome.PASSED, f"acceptance {rate} over {int(drafts)} drafts", ExitCode.OK


def result_fields(
    measured: dict[str, Any],
    *,
    outcome: str,
    prompts: int,
    tokens: int,
    cost_ratio: float | None,
    seconds: float,
    min_acceptance: float | None,
    min_speedup: float | None,
) -> dict[str, Any]:
    """The report's `evaluation` (status.evaluation and the provenance record)."""
    out = {
        "outcome": outcome,
        "prompts": prompts,
        "tokens": tokens,
        "k": measured.get("k"),
        "drafts": measured.get("drafts"),
        "rate": measured.get("rate"),
        "meanAcceptedLength": measured.get("meanAcceptedLength"),
        "alpha": measured.get("alpha"),
        "perPosition": measured.get("perPosition"),
        "predictedSpeedup": measured.get("predictedSpeedup"),
        "costRatio": None if cost_ratio is None else round(cost_ratio, 6),
        "minAcceptance": min_acceptance,
        "minSpeedup": min_speedup,
        "seconds": round(seconds, 1),
    }
    return {k: v for k, v in out.items() if v is not None}


# ---- talking to vLLM ----------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the stage's own server
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


def wait_ready(endpoint: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if http_get(f"{endpoint}/health", 5)[0] == 200:
            return True
        time.sleep(2)
    return False


def counters(endpoint: str) -> Sample:
    code, text = http_get(f"{endpoint}/metrics")
    if code != 200:
        raise MetricsError("Unreachable", f"GET {endpoint}/metrics answered {code or 'nothing'}")
    return parse_sample(text)


def settled(endpoint: str, deadline: float) -> Sample:
    """The counters once two reads a second apart agree (vLLM records a step's stats after answering)."""
    last = counters(endpoint)
    while time.monotonic() < deadline:
        time.sleep(1)
        cur = counters(endpoint)
        if cur.counters() == last.counters():
            return cur
        last = cur
    return last


def _counters_or_none(endpoint: str) -> Sample | None:
    """The counters, or None where vLLM exports no spec-decode counters (it drafts nothing)."""
    try:
        return counters(endpoint)
    except MetricsError as exc:
        if exc.reason == "NoSpecDecodeMetrics":
            return None
        raise


def _settled_or_none(endpoint: str, deadline: float) -> Sample | None:
    try:
        return settled(endpoint, deadline)
    except MetricsError as exc:
        if exc.reason == "NoSpecDecodeMetrics":
            return None
        raise


def complete(endpoint: str, body: dict[str, Any], timeout: float) -> int:
    """One completion; returns the tokens it generated."""
    req = urllib.request.Request(  # noqa: S310 - the stage's own server
        f"{endpoint}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise EvaluationError(f"vLLM refused a request ({exc.code}): {detail}") from None
    return int((answer.get("usage") or {}).get("completion_tokens") or 0)


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    endpoint = args.endpoint.rstrip("/")
    bounds = {"min_acceptance": args.min_acceptance, "min_speedup": args.min_speedup}
    try:
        prompts = load_prompts(args.prompts_file, args.prompts_json)
        folder = checkpoint_dir(Path(args.checkpoint))
        ck = load_checkpoint(str(folder))
        draft = draft_of(ck)
        verifier, _ = load_verifier_config(args.verifier)
    except (EvaluationError, CheckpointError, RenderError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    k = args.k or draft.speculative_tokens
    cost_ratio = pair_cost_ratio(ck.drafting_shapes, verifier)
    print(f"evaluate: {len(prompts)} prompt(s), {args.max_tokens} tokens each, K={k}, draft {folder}", file=sys.stderr)
    if not wait_ready(endpoint, deadline):
        message = f"the evaluation server {endpoint} was not ready within {args.timeout:.0f} s"
        print(f"evaluate: {NOT_READY}: {message}", file=sys.stderr)
        report("evaluate", evaluation={"outcome": NOT_READY, **_bounds(bounds)}, message=message)
        return NOT_READY.exit_code
    try:
        before, since = _counters_or_none(endpoint), time.time()
        sampling = {
            "model": args.model,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "seed": args.seed,
            "ignore_eos": True,
        }
        left = max(1.0, deadline - time.monotonic())
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            tokens = sum(pool.map(lambda p: complete(endpoint, {**sampling, "prompt": p}, left), prompts))
        after, at = _settled_or_none(endpoint, min(deadline, time.monotonic() + 30)), time.time()
    except (EvaluationError, MetricsError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return ExitCode.PROBLEM  # the Job retries: a server that restarted mid-evaluation is measured again
    if after is None:  # no spec-decode counters at all: vLLM was started without a speculative config
        after = before = Sample()
    inc, _ = increment(before or Sample(), after, since, at)
    totals = Totals(
        drafts=inc.drafts,
        draft_tokens=inc.draft_tokens,
        accepted=inc.accepted,
        per_position=list(inc.per_position),
        generated=inc.generated,
        span=at - since,
        counted=1,
    )
    observed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    measured = stored(
        acceptance_status(
            totals, Economics(k, draft.algorithm, cost_ratio, k), revision=None, observed_at=observed, min_samples=1
        )
    )
    outcome, message, code = judge(measured, args.min_acceptance, args.min_speedup)
    result = result_fields(
        measured,
        outcome=outcome,
        prompts=len(prompts),
        tokens=tokens,
        cost_ratio=cost_ratio,
        seconds=time.monotonic() - t0,
        **bounds,
    )
    print(f"evaluate: {outcome}: {message}", file=sys.stderr)
    print(json.dumps(result, sort_keys=True), flush=True)
    report("evaluate", evaluation=result, message=message)
    return code


def _bounds(bounds: dict[str, float | None]) -> dict[str, float]:
    names = {"min_acceptance": "minAcceptance", "min_speedup": "minSpeedup"}
    return {names[k]: v for k, v in bounds.items() if v is not None}
