"""The stages that make a servable checkpoint without training one, or finish an MTP one:

- convert: `speculators convert SOURCE --verifier V --algorithm A --output-path CHECKPOINTS` turns a draft
  published in another project's layout (SafeAILab EAGLE-3, z-lab DFlash, a model's native MTP layers) into
  speculators' format; draft.targetLayerIds becomes the converter's aux layer ids, draft.numSpeculativeSteps
  the MTP steps, convert.normBeforeResidual the eagle3 setting (--algorithm-kwargs, speculators 0.9.0
  cli/convert.py);
- stitch: `speculators stitch-mtp CHECKPOINT VERIFIER --output-path STITCHED` writes an mtp head (trained or
  converted) back into a copy of its verifier, which vLLM serves with method mtp (an mtp checkpoint is not
  loadable as a draft). The trainer entrypoint resolves CHECKPOINT to the run's best or last epoch.
"""

from __future__ import annotations

import json
from typing import Any

from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.render.training import common
from speculator_operator.render.training.common import CHECKPOINTS, CONVERT_SOURCE, STITCHED, VERIFIER, Inputs, Stage


def convert_kwargs(inputs: Inputs) -> dict[str, Any]:
    """speculators convert's --algorithm-kwargs for this spec (its converters' keyword arguments)."""
    spec = inputs.spec
    assert spec.convert is not None
    kwargs: dict[str, Any] = {}
    layers = spec.draft.target_layer_ids
    if spec.algorithm == Algorithm.EAGLE3.value:
        if spec.convert.norm_before_residual is not None:
            kwargs["norm_before_residual"] = spec.convert.norm_before_residual
        if layers:
            kwargs["eagle_aux_hidden_state_layer_ids"] = list(layers)
    elif spec.algorithm == Algorithm.DFLASH.value:
        if layers:
            kwargs["aux_hidden_state_layer_ids"] = list(layers)
    elif spec.algorithm == Algorithm.MTP.value and spec.draft.num_speculative_steps is not None:
        kwargs["num_speculative_steps"] = spec.draft.num_speculative_steps
    return kwargs


def convert_stage(inputs: Inputs) -> Stage | None:
    if inputs.spec.convert is None:
        return None
    command = [
        "speculators", "convert", CONVERT_SOURCE,
        "--verifier", VERIFIER,
        "--algorithm", inputs.spec.algorithm,
        "--output-path", CHECKPOINTS,
    ]  # fmt: skip
    kwargs = convert_kwargs(inputs)
    if kwargs:
        command += ["--algorithm-kwargs", json.dumps(kwargs, separators=(",", ":"), sort_keys=True)]
    container = common.make_container(inputs.release.image("trainer"), common.wrapped("convert", command))
    # 1 is what the converters' ValueError (a key or shape that does not fit) exits with: no retry mends it
    job = common.make_job(inputs, "convert", inputs.spec.stages.cpu, container, fail_fast_codes=(1, 2))
    return Stage("convert", "Converting", [job], command=command)


def stitch_stage(inputs: Inputs) -> Stage | None:
    if inputs.spec.algorithm != Algorithm.MTP.value:
        return None
    command = ["speculators", "stitch-mtp", CHECKPOINTS, VERIFIER, "--output-path", STITCHED]
    container = common.make_container(inputs.release.image("trainer"), common.wrapped("stitch", command))
    job = common.make_job(inputs, "stitch", inputs.spec.stages.cpu, container, fail_fast_codes=(1, 2))
    return Stage("stitch", "Stitching", [job], command=command)
