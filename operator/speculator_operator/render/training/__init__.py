"""Pure builders of a SpeculatorTrainJob's children: one Job per stage, the vLLM servers some stages
talk to, the workspace claim, and the exact `speculators` / vLLM command lines for the pinned release.

Facts (docs/reference/speculators.md §1; docs/reference/vllm.md §1.3):
- every `speculators` stage and vLLM mount one workspace at one path (/workspace): the extraction
  server returns its own absolute file paths, which the client moves or the trainer reads and deletes;
- the verifier is staged once into the workspace at the resolved revision, and that path is both
  vLLM's served model name and the trainer's --verifier-name-or-path (they must be equal);
- extraction asks vLLM for the target layers plus the last layer L; the trainer gets the target
  layers only;
- prepare-data skips token_freq.pt unless told otherwise: --no-skip-token-freq whenever a draft
  vocabulary is set;
- offline training says --on-missing raise (the default, generate, would silently go online);
  generate-offline-data gets --fail-on-error --validate-outputs (it exits 0 on skipped samples);
- the evaluate stage's held-out samples are split off the prepared data before extraction (the trainer
  reads hs_<i> for every prepared row i, so the split renumbers both alike);
- regenerate-responses output is pretokenized: prepare-data needs no render endpoint for it;
  natural-language conversations need vLLM's render endpoint (--enable-scale-out from 0.30).
"""

from __future__ import annotations

from typing import Any

from speculator_operator.domain.algorithms import TABLE, Algorithm
from speculator_operator.domain.releases import supported
from speculator_operator.render.serving import RenderError
from speculator_operator.render.training import common
from speculator_operator.render.training.common import (
    CHECKPOINTS,
    SERVER_ROLES,
    VERIFIER,
    WORKSPACE,
    Inputs,
    Stage,
    claim_name,
    job_name,
    server_name,
    verifier_facts,
    verifier_layers,
)
from speculator_operator.render.training.convert import convert_kwargs, convert_stage, stitch_stage
from speculator_operator.render.training.data import fetch_stage, needs_render, prepare_stage, regenerate_stage
from speculator_operator.render.training.evaluate import evaluate_stage
from speculator_operator.render.training.finish import audit_stage, publish_stage
from speculator_operator.render.training.hidden_states import extract_stage, kv_transfer_config, server, server_args
from speculator_operator.render.training.sweep import sweep_stages
from speculator_operator.render.training.train import (
    OWNED_TRAIN_FLAGS,
    TRAIN_FLAGS,
    check_train_args,
    train_command,
    train_stage,
)

__all__ = [
    "CHECKPOINTS",
    "OWNED_TRAIN_FLAGS",
    "SERVER_ROLES",
    "TRAIN_FLAGS",
    "VERIFIER",
    "WORKSPACE",
    "Inputs",
    "Stage",
    "check_train_args",
    "convert_kwargs",
    "job_name",
    "kv_transfer_config",
    "needs_render",
    "render_all",
    "server",
    "server_args",
    "server_name",
    "stages",
    "train_command",
    "verifier_facts",
    "verifier_layers",
    "workspace_claim",
]


def stages(inputs: Inputs) -> list[Stage]:
    """Every stage of this job, in order. A job whose release cannot serve what it makes is refused: its draft
    could be neither evaluated nor deployed with that release (P-EAGLE from vLLM 0.34, docs/reference/vllm.md)."""
    algorithm = inputs.spec.algorithm
    if not TABLE[Algorithm(algorithm)].stitched:
        refusal = inputs.release.serving_refusal(algorithm)
        if refusal:
            serving = [r.name for r in supported() if not r.serving_refusal(algorithm)]
            way_out = (
                f"name a release that serves {algorithm}: {', '.join(serving)}"
                if serving
                else (f"no usable release serves {algorithm}")
            )
            raise RenderError(f"release {inputs.release.name} cannot serve what this job makes: {refusal}; {way_out}")
    if inputs.spec.convert is not None:
        found = [fetch_stage(inputs), convert_stage(inputs)]
    else:
        found = [fetch_stage(inputs), regenerate_stage(inputs), prepare_stage(inputs), extract_stage(inputs),
                 train_stage(inputs)]  # fmt: skip
    found += [stitch_stage(inputs), audit_stage(inputs), evaluate_stage(inputs), *sweep_stages(inputs),
              publish_stage(inputs)]  # fmt: skip
    return [s for s in found if s is not None]


def workspace_claim(inputs: Inputs) -> dict[str, Any] | None:
    ws = inputs.spec.workspace
    if ws.claim_name:
        return None
    spec: dict[str, Any] = {"accessModes": [ws.access_mode], "resources": {"requests": {"storage": ws.size}}}
    if ws.storage_class_name:
        spec["storageClassName"] = ws.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": common.make_meta(inputs, claim_name(inputs), None),
        "spec": spec,
    }


def render_all(inputs: Inputs) -> list[dict[str, Any]]:
    """Every child the job can have over its life (the `render` command's preview), in stage order."""
    out: list[dict[str, Any]] = []
    claim = workspace_claim(inputs)
    if claim:
        out.append(claim)
    seen: set[str] = set()
    for stage in stages(inputs):
        if stage.server and stage.server not in seen:
            seen.add(stage.server)
            out += server(inputs, stage.server)
        out += stage.children
    return out
