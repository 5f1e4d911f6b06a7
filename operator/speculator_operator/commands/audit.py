"""`speculator-operator audit SOURCE`: a draft checkpoint audited header-only against its verifier and a pinned
release, with the draft's economics (cost ratio, break-even acceptance, load model) where the verifier is given,
printed as text or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from speculator_operator.adapters.checkpoints import audit, load_verifier_config, read_verifier
from speculator_operator.domain.checkpoint import AuditReport
from speculator_operator.domain.economics import break_even_alpha, draft_forwards
from speculator_operator.domain.priors import pair_load, pair_size, prior
from speculator_operator.domain.releases import get_release, release_for
from speculator_operator.domain.sweep import device_class


def _economics(
    report: AuditReport, verifier: dict[str, Any] | None, device: str | None = None, tensor_parallel: int = 1
) -> dict[str, Any] | None:
    # the planner's status shape, imported here: the in-pod sub-commands load this module in environments that hold
    # only the trainer's requirements (the planners pull in the operator's own, prometheus_client among them)
    from speculator_operator.planning.deployment import load_status

    ck = report.checkpoint
    if verifier is None or ck.speculative_tokens is None or ck.algorithm is None:
        return None
    size = pair_size({n: t.shape for n, t in ck.tensors.items()}, verifier)
    if size is None:
        return None
    k = ck.speculative_tokens
    cls = device_class(device) if device else None
    p = prior(size, cls, ck.algorithm, k, tensor_parallel)
    load = pair_load(size, cls, tensor_parallel)
    n = draft_forwards(ck.algorithm, k)
    alpha = break_even_alpha(k, p.cost_ratio, n)
    return {
        "cost_ratio": round(p.cost_ratio, 6),
        "cost_source": "prior",
        "prior": p.key,
        "parameter_ratio": round(size.parameter_ratio, 6),
        "draft_forwards_per_step": n,
        "break_even_acceptance": None if alpha is None else round(alpha, 4),
        # what prices a schedule under load: the prior row's load model (status.economics.loadModel), or None where
        # the saturation model does (a CPU: serving.tuning.saturationTokens)
        "load_model": None if load is None else load_status(load).model_dump(mode="json"),
    }


def run(args: argparse.Namespace) -> int:
    release = get_release(args.release) if not args.vllm else release_for(vllm=args.vllm)
    verifier = None
    ref = None
    served = None
    if args.verifier:
        ref = read_verifier(args.verifier)
        verifier, served = ref.config, args.verifier
    elif args.verifier_config:
        verifier, _ = load_verifier_config(args.verifier_config)
    report = audit(
        args.source,
        verifier=verifier,
        verifier_revision=None if ref is None else ref.revision,
        verifier_content=None if ref is None else ref.content,
        served_verifier=served,
        release=release,
        allow_lossy=args.allow_lossy,
        deep=args.deep,
    )
    econ = _economics(report, verifier, args.device_class, args.tensor_parallel_size)
    if econ:
        report.extra["economics"] = econ
    if args.format == "json":
        print(json.dumps(report.as_dict(), indent=2))
    else:
        _print_text(report)
    return 0 if report.ok else 1


def _print_text(report: AuditReport) -> None:
    s = report.checkpoint.summary()
    print(f"checkpoint  {s['uri']}" + (f" @ {s['revision']}" if s["revision"] else ""))
    if s["stitched_mtp"]:
        stitched = s["stitched_mtp"]
        print(f"            stitched MTP model: {stitched['model_type']}, {stitched['mtp_layers']} MTP layer(s)")
    else:
        print(
            f"            {s['algorithm']} (speculators {s['speculators_version']}), hidden {s['hidden_size']}, "
            f"vocab {s['draft_vocab_size']}/{s['verifier_vocab_size']}, aux layers {s['aux_layer_ids']}, "
            f"K={s['speculative_tokens']}, verifier {s['recorded_verifier']}"
        )
    if report.release is not None:
        print(f"release     {report.release.name} (speculators {report.release.speculators}, vLLM {report.vllm})")
    econ = report.extra.get("economics")
    if econ:
        print(
            f"economics   cost ratio c={econ['cost_ratio']} (prior {econ['prior']}; parameter ratio "
            f"{econ['parameter_ratio']}), break-even acceptance {econ['break_even_acceptance']} at "
            f"K={s['speculative_tokens']}"
        )
        load = econ.get("load_model")
        if load:
            print(
                f"under load  {econ['prior']} load model: verifier step {load['verifier_fixed_ms']:.3g} ms "
                f"+ {load['verifier_token_ms']:.3g} ms a token + {load['verifier_request_ms']:.3g} ms a request; "
                f"draft forward {load['draft_fixed_ms']:.3g} ms + {load['draft_token_ms']:.3g} ms a token + "
                f"{load['draft_request_ms']:.3g} ms a request"
            )
        else:
            print("under load  saturation model (serving.tuning.saturationTokens)")
    for f in report.findings:
        print(f"{f.severity.upper():8} {f.rule:22} {f.message}")
    errors = len(report.errors)
    warnings = sum(1 for f in report.findings if f.severity == "warning")
    verdict = "OK" if report.ok else "FAILED"
    print(
        f"result      {verdict}: {errors} error(s), {warnings} warning(s); read {s['bytes_read']:,} of "
        f"{s['bytes_on_disk']:,} bytes in {s['requests']} request(s), {report.seconds * 1000:.1f} ms"
    )
