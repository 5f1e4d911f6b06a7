"""Run inside a server image (its own Python, its own vLLM): check rendered vLLM command lines step by step with
vLLM's own code, as far as each step runs without an accelerator.

stdin: a JSON list of {"name": ..., "args": ["serve", MODEL, FLAGS...]} (the arguments the operator renders after
`speculator-operator serve ... --`; MODEL and the draft's path must exist in the container: the images tier mounts
the tiny verifier and a draft of the right algorithm where the pods stage them).
stdout: one JSON object {"platform": vLLM's device type ("" none), "results": [{"name", "steps": [{"step", "ok",
"error"}]}]}. The steps, each only after the one before passed:
  parse             vLLM's `serve` parser (`make_arg_parser`) and `validate_parsed_serve_args`
  engine-args       `AsyncEngineArgs.from_cli_args`
  model-config      the verifier's `ModelConfig` (`create_model_config`)
  speculative-config the long-form `--speculative-config` through `create_speculative_config`: vLLM's own
                    validation of the method, the draft's config and K against the verifier
  engine-config     the whole `create_engine_config` (the first step that asks the platform for a device)
Exit status 0 whatever the verdicts: the caller judges them.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from typing import Any


def _error(exc: BaseException) -> str:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return last[-1500:]


def check(args: list[str]) -> list[dict[str, Any]]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:  # vLLM 0.34 moved the frontend's arguments to entrypoints/common
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    steps: list[dict[str, Any]] = []

    def step(name: str, fn: Any) -> Any:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                value = fn()
        except (Exception, SystemExit) as exc:  # argparse exits after printing why; vLLM raises what it raises
            why = said.getvalue().strip().splitlines()[-1:] if isinstance(exc, SystemExit) else []
            steps.append({"step": name, "ok": False, "error": "; ".join([_error(exc), *why])})
            raise
        steps.append({"step": name, "ok": True, "error": ""})
        return value

    if len(args) < 2 or args[0] != "serve":
        return [{"step": "parse", "ok": False, "error": f"not a serve command: {args[:2]}"}]
    model, flags = args[1], args[2:]
    try:

        def parse() -> Any:
            parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
            ns = parser.parse_args([*flags, "--model", model])
            validate_parsed_serve_args(ns)
            return ns

        ns = step("parse", parse)
        engine = step("engine-args", lambda: AsyncEngineArgs.from_cli_args(ns))
        model_config = step("model-config", engine.create_model_config)

        def speculative() -> Any:
            from vllm.config import ParallelConfig

            parallel = ParallelConfig(
                tensor_parallel_size=engine.tensor_parallel_size,
                pipeline_parallel_size=engine.pipeline_parallel_size,
                data_parallel_size=engine.data_parallel_size,
            )
            return engine.create_speculative_config(model_config, parallel)

        step("speculative-config", speculative)
        engine = AsyncEngineArgs.from_cli_args(ns)  # create_* may have filled fields: start the whole again
        step("engine-config", engine.create_engine_config)
    except (Exception, SystemExit):
        return steps  # the step that failed is the last one recorded
    return steps


def main() -> None:
    from vllm.platforms import current_platform

    cases = json.load(sys.stdin)
    results = [{"name": c["name"], "steps": check(list(c["args"]))} for c in cases]
    print(json.dumps({"platform": current_platform.device_type, "results": results}))


if __name__ == "__main__":
    main()
