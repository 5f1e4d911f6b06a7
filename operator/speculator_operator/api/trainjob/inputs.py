"""What a SpeculatorTrainJob makes its draft from: the verifier, the training data (given sources, answers the
verifier regenerates, or both), the draft's shape, or instead a published third-party draft to convert."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from speculator_operator.api.common import Model, SecretRef
from speculator_operator.api.deployment.inputs import Verifier

_PRESETS = ("sharegpt", "ultrachat", "gsm8k", "magpie", "nemotron", "open-perfectblend", "hermes-fc")
_SOURCE = r"^(hf:[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]*){0,2}|hf://datasets/.+\.jsonl?|s3://[a-z0-9][a-z0-9.-]*/.+|pvc://[a-z0-9][a-z0-9.-]*/.+)$"


def _preserve(description: str) -> Any:
    extra: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
    return Field(default=None, description=description, json_schema_extra=extra)


class TrainVerifier(Verifier):
    """The target model the draft is trained for."""

    num_hidden_layers: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="The verifier's num_hidden_layers as you expect it. Optional: the job stops (Failed, "
        "InvalidSpec) before any stage runs if the verifier's config.json says otherwise, and an offline "
        "`speculator-operator render` (no network) picks the layers to extract from it.",
    )


class Regenerate(Model):
    """On-policy data: the verifier answers the prompts itself (speculators regenerate-responses)."""

    dataset: str = Field(
        min_length=1,
        max_length=512,
        description=f"A preset ({', '.join(_PRESETS)}) or a .json/.jsonl source (s3:// or pvc://).",
    )
    split: str | None = Field(
        default=None, max_length=64, description="The dataset split to answer (regenerate-responses --split)."
    )
    subset: str | None = Field(
        default=None, max_length=128, description="The dataset subset to answer (regenerate-responses --subset)."
    )
    limit: int | None = Field(default=None, ge=1, le=100_000_000, description="Prompts to answer.")
    max_tokens: int = Field(default=8192, ge=1, le=1_048_576, description="Longest generated answer.")
    concurrency: int = Field(
        default=64, ge=1, le=4096, description="Requests in flight to the verifier server (--concurrency)."
    )
    sampling_params: dict[str, Any] | None = _preserve("JSON sampling parameters for the verifier.")


class Data(Model):
    """The training data: given sources, answers the verifier regenerates, or both (pretokenized sources only);
    prepare-data turns them into the training rows. Exactly one of data and convert is set."""

    sources: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Inputs for prepare-data: hf:org/dataset[:subset:split], hf://datasets/org/repo/file.jsonl, "
        "s3://bucket/file-or-prefix, pvc://claim/path. Left out when regenerate produces the data.",
        json_schema_extra={"items": {"type": "string", "maxLength": 512, "pattern": _SOURCE}},
    )
    format: Literal["conversations", "pretokenized"] = Field(
        default="conversations",
        description="conversations: rendered through the verifier's chat template by a vLLM render endpoint; "
        "pretokenized: rows already carry input_ids and loss_mask (no server needed).",
    )
    regenerate: Regenerate | None = None
    max_samples: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Use at most this many samples (prepare-data and generate-offline-data --max-samples); default: "
        "all. With evaluation, heldOut of them are split off for it.",
    )
    seq_length: int = Field(default=8192, ge=16, le=1_048_576, description="Truncation length and tokens per step.")


class Draft(Model):
    """The draft's shape; anything left out takes speculators' own default for the algorithm."""

    num_layers: int | None = Field(
        default=None, ge=1, le=64, description="Decoder layers of the draft (speculators train --num-layers)."
    )
    draft_arch: Literal["llama", "qwen3"] | None = Field(
        default=None, description="The draft's decoder layer architecture, llama or qwen3 (--draft-arch)."
    )
    draft_vocab_size: int | None = Field(
        default=None, ge=1, le=1_048_576, description="Reduced vocabulary; token frequencies are then always written."
    )
    block_size: int | None = Field(default=None, ge=1, le=64, description="DFlash family: tokens per block (>= 2).")
    ttt_steps: int | None = Field(default=None, ge=1, le=64, description="EAGLE-3: training-time test steps (= K).")
    num_depths: int | None = Field(default=None, ge=1, le=64, description="P-EAGLE: parallel depths (= K).")
    num_speculative_steps: int | None = Field(default=None, ge=1, le=64, description="MTP: steps (= K).")
    target_layer_ids: list[int] | None = Field(
        default=None,
        max_length=16,
        description="Verifier layers the draft reads (default [2, L//2, L-3]); extraction adds the last layer L.",
        json_schema_extra={"items": {"type": "integer", "minimum": 0, "maximum": 1024}},
    )
    from_pretrained: str | None = Field(default=None, max_length=512, description="Start from this draft (path or id).")


class Convert(Model):
    """A draft published in another project's layout, turned into speculators' format by the pinned
    `speculators convert` (its --algorithm is the job's algorithm: eagle3 reads SafeAILab's EAGLE-3
    checkpoints, dflash z-lab's DFlash, mtp a model with native MTP layers such as Qwen3-Next). The job then
    runs fetch -> convert -> audit -> publish (mtp: stitched into the verifier first): no data, no hidden
    states, no training. draft.targetLayerIds, when given, sets the verifier layers the draft reads (eagle3,
    dflash) and draft.numSpeculativeSteps the MTP steps."""

    source: str = Field(
        max_length=512,
        pattern=r"^(hf://[A-Za-z0-9][\w.-]*/[\w.-]+|s3://[a-z0-9][a-z0-9.-]*/.+|pvc://[a-z0-9][a-z0-9.-]*/.+)$",
        description="The third-party checkpoint: hf://org/repo, s3://bucket/prefix or pvc://claim/path (a folder "
        "with config.json and model.safetensors or pytorch_model.bin).",
    )
    revision: str | None = Field(
        default=None, min_length=1, max_length=255, description="Branch, tag or commit of a hub source (default main)."
    )
    credentials: SecretRef | None = Field(default=None, description="Secret with HF_TOKEN or AWS_* for the source.")
    norm_before_residual: bool | None = Field(
        default=None,
        description="eagle3: the source normalises before the residual (speculators' converter default: false).",
    )
