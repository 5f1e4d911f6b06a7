"""SpeculatorTrainJob: data -> hidden states -> training -> audit -> publish, one Kubernetes Job per stage; or,
with `convert`, a published third-party draft -> `speculators convert` -> audit -> publish.

The spec admits only the pipeline that works with the pinned speculators release (see
docs/reference/speculators.md §1): token frequencies are always written when a draft vocabulary is
set, offline runs never fall back to online generation, the extraction server's model name is the
trainer's verifier name, and hybrid hidden-state caching (gone in 0.9.0) cannot be asked for.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from speculator_operator.api.common import Condition, Model, SecretRef
from speculator_operator.api.deployment import OWNED_FLAGS, AuditSummary, Verifier, extra_args_schema
from speculator_operator.api.parallelism import Parallelism, layout, layout_rules
from speculator_operator.domain.algorithms import CONVERTIBLE, DFLASH_TRAINABLE
from speculator_operator.domain.algorithms import Algorithm as Algo
from speculator_operator.domain.parallelism import Layout

# the algorithm table's trainable ones, spelled out for the schema (a test checks they agree)
Algorithm = Literal["eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp"]
Phase = Literal[
    "Pending", "Regenerating", "Preparing", "Extracting", "Training", "Converting", "Stitching", "Auditing",
    "Evaluating", "Sweeping", "Publishing", "Succeeded", "Failed",
]  # fmt: skip
StagePhase = Literal["Pending", "Running", "Succeeded", "Failed"]

_PRESETS = ("sharegpt", "ultrachat", "gsm8k", "magpie", "nemotron", "open-perfectblend", "hermes-fc")
_SOURCE = r"^(hf:[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]*){0,2}|hf://datasets/.+\.jsonl?|s3://[a-z0-9][a-z0-9.-]*/.+|pvc://[a-z0-9][a-z0-9.-]*/.+)$"


# the extraction server's own flags on top of the serving ones
SERVER_OWNED_FLAGS = (*OWNED_FLAGS, "--kv-transfer-config", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
                      "--enable-scale-out")  # fmt: skip


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


class PodOptions(Model):
    """Where and how a stage's pods run."""

    resources: dict[str, dict[str, int | str]] | None = Field(
        default=None, description="Container resources; GPU stages default to nvidia.com/gpu per node."
    )
    node_selector: dict[str, str] | None = Field(
        default=None,
        description="The stage pods' nodeSelector (label: value), e.g. nvidia.com/gpu.product for the GPU stages.",
    )
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        description="The stage pods' tolerations (Kubernetes Toleration objects: key, operator, value, effect, "
        "tolerationSeconds), e.g. for a tainted GPU node pool.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    labels: dict[str, str] | None = Field(default=None, description="Extra pod labels.")
    annotations: dict[str, str] | None = Field(default=None, description="Extra pod annotations.")
    image: str | None = Field(
        default=None,
        max_length=512,
        description="The image instead of the release's (`speculator-operator images`), e.g. the server image's cpu "
        "variant for vLLM servers on CPU nodes, or a copy in one's own registry. It must hold this package and the "
        "release's tools.",
    )
    env: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=64,
        description="More environment variables (name/value or valueFrom), e.g. OMP_NUM_THREADS.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
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


class Sweep(Model):
    """A measured throughput-versus-interactivity sweep after the acceptance gate (docs/concepts/sweep.md): the pinned
    vLLM serves the pair once per K (the evaluated K, half of it rounded up, and plain decoding without a draft), and
    closed-loop clients measure output tokens/s, vLLM's inter-token latency and running requests at concurrencies
    1, 2, 4 … up to maxConcurrency. The curve is published in the provenance record beside the draft; a
    SpeculatorDeployment serving the draft on the same device class renders its per-batch-size schedule from it."""

    max_concurrency: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="The highest concurrency measured (never above the number of prompts evaluated).",
    )
    rounds: int = Field(
        default=2,
        ge=1,
        le=32,
        description="Requests per point: rounds × concurrency (each client sends this many, one after another).",
    )
    timeout_seconds: int = Field(
        default=3600,
        ge=60,
        le=86_400,
        description="How long each of the sweep's server lifetimes may take, its vLLM server's start included: a sweep "
        "that is not done by then fails the job (SweepFailed) at the point it reached.",
    )


class Evaluation(Model):
    """The acceptance gate before publish: the pinned vLLM serves the verifier with the audited draft, the
    held-out prompts are sent to it with fixed sampling, and acceptance is read from vLLM's own counters.
    A draft below minAcceptance (or below minSpeedup) fails the job with reason AcceptanceBelowThreshold and
    is not published; without either bound the stage only measures (the numbers go into the status and
    the provenance record)."""

    min_acceptance: float | None = Field(
        default=None, ge=0, le=1, description="Lowest acceptance rate (accepted / drafted tokens) to publish."
    )
    min_speedup: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Lowest predicted speedup (E(alpha, K) / (1 + n*c), c the draft/verifier cost ratio) to publish.",
    )
    held_out: int = Field(
        default=16,
        ge=1,
        le=100_000,
        description="Samples split off the prepared data before extraction and training (the draft never sees "
        "them); their prompts are what is evaluated. Ignored when prompts are given.",
    )
    prompts: list[str] | None = Field(
        default=None,
        max_length=1024,
        description="Prompts to evaluate instead of held-out samples (a convert job has no data: it needs these).",
        json_schema_extra={"items": {"type": "string", "minLength": 1, "maxLength": 16384}},
    )
    max_tokens: int = Field(default=64, ge=1, le=65_536, description="Tokens generated per prompt (EOS ignored).")
    temperature: float = Field(default=0.0, ge=0, le=2, description="0: greedy.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Sampling seed, where temperature > 0.")
    num_speculative_tokens: int | None = Field(
        default=None, ge=1, le=64, description="K to evaluate with (default: the checkpoint's)."
    )
    concurrency: int = Field(default=4, ge=1, le=1024, description="Requests in flight.")
    timeout_seconds: int = Field(
        default=1800,
        ge=60,
        le=86_400,
        description="How long the stage may take, its vLLM server's start included: a server that is not ready "
        "by then fails the job (EvaluationServerNotReady).",
    )
    sweep: Sweep | None = Field(
        default=None, description="Measure throughput against concurrency per K after the gate (off by default)."
    )


class Workspace(Model):
    """The shared volume: data, hidden states, checkpoints. vLLM and the trainer mount it at one path."""

    claim_name: str | None = Field(default=None, max_length=253, description="An existing claim to use.")
    size: str = Field(
        default="100Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$",
        description="Storage request of the claim the operator creates (a Kubernetes quantity, default 100Gi). It "
        "holds the verifier, the data, the hidden states (offline: every sample's, the largest part) and the "
        "checkpoints. Ignored with claimName.",
    )
    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="StorageClass of the claim the operator creates (default: the cluster's default class). It must "
        "offer accessMode: a class without ReadWriteMany leaves the claim Pending and the stage pods unscheduled "
        "(docs/operations/troubleshooting.md). Ignored with claimName.",
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        default="ReadWriteMany",
        description="ReadWriteMany (default): stages on different nodes share the volume. ReadWriteOnce only works "
        "when every stage pod lands on one node (pin them with stages.*.nodeSelector); it refuses online hidden "
        "states with the file or fp8 backend and training on several nodes.",
    )


class HiddenStates(Model):
    """How the verifier's hidden states reach the trainer: vLLM extraction servers and the hs-connectors backend."""

    mode: Literal["offline", "online"] = Field(
        default="offline",
        description="offline: extract every sample first (generate-offline-data), then train with "
        "--on-missing raise; online: the trainer asks the extraction server while it trains.",
    )
    backend: Literal["file", "fp8", "mooncake"] = Field(default="file", description="hs-connectors backend.")
    mooncake_master: str | None = Field(default=None, max_length=253, description="host:port of mooncake_master.")
    replicas: int = Field(default=1, ge=1, le=256, description="Extraction servers (offline: one data rank each).")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="The same as parallelism.tensor.")
    parallelism: Parallelism | None = Field(
        default=None,
        description="Pipeline, data and node counts of each extraction server (and tensor, as tensorParallelSize). "
        "Nodes above 1 run each server as one LeaderWorkerSet group, for verifiers larger than one node.",
    )
    concurrency: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="Offline: requests in flight from each extraction client rank "
        "(generate-offline-data --concurrency).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More vLLM arguments for the extraction and plain verifier servers (e.g. --max-model-len); "
        "flags the operator owns are refused.",
        json_schema_extra=extra_args_schema(SERVER_OWNED_FLAGS),
    )

    @property
    def layout(self) -> Layout:
        return layout(self.parallelism, self.tensor_parallel_size)


class Training(Model):
    """The training stage: torchrun of the pinned `speculators train`."""

    epochs: int = Field(default=3, ge=1, le=10_000, description="Passes over the training data (--epochs).")
    lr: float | None = Field(default=None, ge=0, le=10, description="Learning rate (speculators' default if unset).")
    nodes: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Trainer pods, one per node (torchrun --nnodes); above 1 a headless Service carries the "
        "rendezvous and the workspace must be ReadWriteMany.",
    )
    gpus_per_node: int = Field(
        default=1,
        ge=1,
        le=64,
        description="GPUs each trainer pod asks for and trains on (nvidia.com/gpu, torchrun --nproc-per-node).",
    )
    fsdp: bool = Field(default=False, description="Shard with FSDP2 instead of DDP.")
    dry_run: bool = Field(
        default=False,
        description="Build and save the initialised draft without training (speculators train --dry-run): no "
        "accelerator, no hidden states; checks the rest of the pipeline end to end.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More `speculators train` flags; each must be a flag of the pinned speculators, and flags "
        "the operator renders are refused.",
        json_schema_extra={"items": {"type": "string", "maxLength": 1024}},
    )


class Output(Model):
    """Where the audited checkpoint is published. Nothing published is ever overwritten: under s3:// and
    pvc:// each run publishes to its own content-addressed folder `URI/sha256-<digest>` and then points
    `URI/speculators-latest.json` at it; on the hub each publish is one commit. status.checkpoint.uri is
    that exact location."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.keepLatest) || self.uri.startsWith('s3://')",
                    "message": "keepLatest applies to s3:// outputs (hub commits are history; the operator does "
                    "not mount pvc:// outputs)",
                    "fieldPath": ".keepLatest",
                }
            ]
        }
    )

    uri: str = Field(
        max_length=512,
        pattern=r"^(s3://[a-z0-9][a-z0-9.-]*/.+|hf://[A-Za-z0-9][\w.-]*/[\w.-]+|pvc://[a-z0-9][a-z0-9.-]*/.+)$",
        description="Where the audited checkpoint is published: s3://bucket/prefix, hf://org/repo or pvc://claim/path.",
    )
    credentials: SecretRef | None = Field(default=None, description="Secret with AWS_* or HF_TOKEN.")
    keep_latest: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="s3:// only: after this job publishes, delete the published folders under uri beyond the newest "
        "keepLatest, except any that a ReplicaSet, a SpeculatorDeployment or a SpeculatorTrainJob's status still "
        "names. Unset: nothing is ever deleted.",
    )


class Stages(Model):
    """Per-stage pod options: cpu stages (fetch, regenerate, prepare, extract client, audit, publish), the
    vLLM servers, and the trainer."""

    cpu: PodOptions = Field(default_factory=PodOptions, json_schema_extra={"default": {}})
    server: PodOptions = Field(default_factory=PodOptions, json_schema_extra={"default": {}})
    trainer: PodOptions = Field(default_factory=PodOptions, json_schema_extra={"default": {}})


def _immutable(field: str) -> dict[str, Any]:
    """A transition rule: like a Job's pod template, what a run was started with does not change under it."""
    return {"x-kubernetes-validations": [{
        "rule": "self == oldSelf",
        "message": f"{field} is immutable once the job exists: delete and re-create the job to change it "
        "(retries, stages and deployTo may change)",
    }]}  # fmt: skip


def _cel(names: tuple[str, ...]) -> str:
    """A CEL list literal of names."""
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


_RULES: list[Any] = [
    {
        "rule": "has(self.data) != has(self.convert)",
        "message": "give data (to train a draft) or convert (to convert a published one), exactly one of them",
    },
    {
        "rule": f"!has(self.convert) || self.algorithm in {_cel(CONVERTIBLE)}",
        "message": "speculators 0.9.0 converts eagle3 (SafeAILab EAGLE-3), dflash (z-lab DFlash) and mtp (native MTP "
        "layers) checkpoints only",
        "fieldPath": ".algorithm",
    },
    {
        "rule": "!has(self.convert) || (!has(self.draft.numLayers) && !has(self.draft.draftArch) && "
        "!has(self.draft.draftVocabSize) && !has(self.draft.blockSize) && !has(self.draft.tttSteps) && "
        "!has(self.draft.numDepths) && !has(self.draft.fromPretrained))",
        "message": "a converted draft keeps the source's shape: of draft, only targetLayerIds (eagle3, dflash) and "
        "numSpeculativeSteps (mtp) apply",
        "fieldPath": ".draft",
    },
    {
        "rule": f"!has(self.convert) || !has(self.draft.targetLayerIds) || self.algorithm != '{Algo.MTP}'",
        "message": "an MTP head reads the verifier's last layer: draft.targetLayerIds does not apply",
        "fieldPath": ".draft.targetLayerIds",
    },
    {
        "rule": f"!has(self.convert) || !has(self.convert.normBeforeResidual) || self.algorithm == '{Algo.EAGLE3}'",
        "message": "convert.normBeforeResidual is an eagle3 setting",
        "fieldPath": ".convert.normBeforeResidual",
    },
    {
        "rule": "!has(self.convert) || ((!has(self.training.nodes) || self.training.nodes == 1) && "
        "(!has(self.training.fsdp) || !self.training.fsdp) && (!has(self.training.dryRun) || !self.training.dryRun) "
        "&& (!has(self.training.extraArgs) || size(self.training.extraArgs) == 0) && !has(self.training.lr))",
        "message": "a converted draft is not trained: leave training out",
        "fieldPath": ".training",
    },
    {
        "rule": "!has(self.convert) || !has(self.convert.revision) || self.convert.source.startsWith('hf://')",
        "message": "convert.revision applies to a hub source (hf://)",
        "fieldPath": ".convert.revision",
    },
    {
        "rule": "!has(self.data) || (has(self.data.sources) && size(self.data.sources) > 0) || "
        "has(self.data.regenerate)",
        "message": "data needs sources or regenerate",
        "fieldPath": ".data",
    },
    {
        "rule": "!has(self.data) || !has(self.data.regenerate) || !has(self.data.sources) || "
        "size(self.data.sources) == 0 || self.data.format == 'pretokenized'",
        "message": "data.regenerate with conversation sources: speculators 0.9.0's prepare-data cannot combine "
        "regenerated rows with rendered conversations in one dataset; regenerate those sources too "
        "(data.regenerate.dataset) or give pretokenized sources",
        "fieldPath": ".data.sources",
    },
    {
        "rule": "!has(self.evaluation) || has(self.data) || (has(self.evaluation.prompts) && "
        "size(self.evaluation.prompts) > 0)",
        "message": "a convert job has no data to hold out: evaluation.prompts names what to evaluate",
        "fieldPath": ".evaluation.prompts",
    },
    {
        "rule": "!has(self.evaluation) || !has(self.data) || !has(self.data.maxSamples) || "
        "has(self.evaluation.prompts) || self.data.maxSamples > self.evaluation.heldOut",
        "message": "evaluation.heldOut must leave samples to train on: it must be below data.maxSamples",
        "fieldPath": ".evaluation.heldOut",
    },
    {
        "rule": "self.hiddenStates.mode == 'online' || self.hiddenStates.backend != 'mooncake'",
        "message": "offline hidden states need a file-like backend (file or fp8): generate-offline-data cannot "
        "use mooncake",
        "fieldPath": ".hiddenStates.backend",
    },
    {
        "rule": "self.hiddenStates.backend != 'mooncake' || has(self.hiddenStates.mooncakeMaster)",
        "message": "the mooncake backend needs hiddenStates.mooncakeMaster",
        "fieldPath": ".hiddenStates.mooncakeMaster",
    },
    {
        "rule": "self.hiddenStates.mode == 'offline' || self.hiddenStates.backend == 'mooncake' || "
        "self.workspace.accessMode == 'ReadWriteMany'",
        "message": "online hidden states with the file or fp8 backend need a ReadWriteMany workspace (vLLM and "
        "the trainer share files at one path) or the mooncake backend",
        "fieldPath": ".workspace.accessMode",
    },
    {
        "rule": "self.training.nodes == 1 || self.workspace.accessMode == 'ReadWriteMany'",
        "message": "training on several nodes needs a ReadWriteMany workspace",
        "fieldPath": ".workspace.accessMode",
    },
    {
        "rule": f"!(self.algorithm in {_cel(DFLASH_TRAINABLE)}) || !has(self.draft.blockSize) || "
        "self.draft.blockSize >= 2",
        "message": "DFlash-family drafts need draft.blockSize >= 2",
        "fieldPath": ".draft.blockSize",
    },
    {
        "rule": f"self.algorithm != '{Algo.MTP}' || (!has(self.draft.draftVocabSize) && !has(self.draft.numLayers) && "
        "!has(self.draft.draftArch))",
        "message": "mtp finetunes the verifier's own MTP layers: draftVocabSize, numLayers and draftArch do not apply",
        "fieldPath": ".draft",
    },
    {
        "rule": "!has(self.draft.fromPretrained) || (!has(self.draft.numLayers) && !has(self.draft.draftArch))",
        "message": "draft.fromPretrained fixes the draft's shape: leave numLayers and draftArch out",
        "fieldPath": ".draft.fromPretrained",
    },
    {
        "rule": "!self.verifier.model.startsWith('pvc://')",
        "message": "a SpeculatorTrainJob reads the verifier's config.json to choose the layers to extract: use a "
        "hub id or s3://",
        "fieldPath": ".verifier.model",
    },
    {
        "rule": "!has(self.draft.targetLayerIds) || "
        "self.draft.targetLayerIds.all(i, self.draft.targetLayerIds.exists_one(j, j == i))",
        "message": "draft.targetLayerIds must be distinct",
        "fieldPath": ".draft.targetLayerIds",
    },
]


class SpeculatorTrainJobSpec(Model):
    """The verifier, the algorithm, the data (or a draft to convert), the stages' settings and where to publish."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": list(_RULES)})

    verifier: TrainVerifier = Field(json_schema_extra=_immutable("verifier"))
    algorithm: Algorithm = Field(
        description="The draft's algorithm (speculators --speculator-type).", json_schema_extra=_immutable("algorithm")
    )
    data: Data | None = Field(default=None, json_schema_extra=_immutable("data"))
    convert: Convert | None = Field(default=None, json_schema_extra=_immutable("convert"))
    draft: Draft = Field(default_factory=Draft, json_schema_extra={"default": {}, **_immutable("draft")})
    hidden_states: HiddenStates = Field(
        default_factory=HiddenStates,
        json_schema_extra={
            "default": {},
            "x-kubernetes-validations": [
                *_immutable("hiddenStates")["x-kubernetes-validations"],
                *layout_rules("hiddenStates"),
            ],
        },
    )
    training: Training = Field(default_factory=Training, json_schema_extra={"default": {}, **_immutable("training")})
    workspace: Workspace = Field(
        default_factory=Workspace, json_schema_extra={"default": {}, **_immutable("workspace")}
    )
    output: Output = Field(json_schema_extra=_immutable("output"))
    evaluation: Evaluation | None = Field(
        default=None,
        description="Evaluate the draft in the pinned vLLM before publishing it (an evaluate stage after the audit). "
        "It may change: a failed evaluate stage runs again with the new bounds once its Job is deleted.",
    )
    release: str | None = Field(default=None, max_length=64, description="Pinned release; default: the default one.")
    stages: Stages = Field(default_factory=Stages, json_schema_extra={"default": {}})
    retries: int = Field(
        default=2, ge=0, le=20, description="Retries of a failed stage (Kubernetes backs off 10 s, 20 s, 40 s, ...)."
    )
    deploy_to: str | None = Field(
        default=None, max_length=253, description="A SpeculatorDeployment in this namespace to serve the result."
    )

    @property
    def dataset(self) -> Data:
        """The data of a training job (a convert job has none: asking for it is a programming error)."""
        if self.data is None:
            raise ValueError("this job converts a published draft: it has no data")
        return self.data


class StageStatus(Model):
    """One stage of the run and its Kubernetes Job."""

    name: str = Field(
        description="The stage: fetch, regenerate, prepare, extract, train, convert, stitch, audit, evaluate, "
        "sweep-k, sweep-half, sweep-plain or publish (only those the spec asks for, in that order)."
    )
    phase: StagePhase = Field(description="Pending, Running, Succeeded or Failed: its Job's state.")
    job: str | None = Field(default=None, description="The stage's Job in this namespace.")
    start_time: str | None = Field(default=None, description="RFC 3339 time its Job started.")
    completion_time: str | None = Field(default=None, description="RFC 3339 time its Job succeeded or failed.")
    failures: int | None = Field(default=None, description="Failed pods so far.")
    message: str | None = Field(
        default=None,
        description="Why it failed or waits: the Job's reason and words, the last pod's log tail, a stuck pod's "
        "kubelet reason, or the server it waits for.",
    )


class Progress(Model):
    """What the stages reported when they ended, and the running stage's live report (its pod's progress
    line, read every SPECULATOR_PROGRESS_SECONDS)."""

    samples_extracted: int | None = Field(
        default=None, description="Samples whose hidden states the extract stage wrote (once it ended)."
    )
    samples_total: int | None = Field(default=None, description="Training samples prepare-data wrote (once it ended).")
    epoch: int | None = Field(default=None, description="The epoch running (from 1); once trained, epochs done.")
    epochs: int | None = Field(default=None, description="Epochs to train (spec.training.epochs).")
    stage: str | None = Field(default=None, description="The stage the live values below come from.")
    samples: int | None = Field(default=None, description="Samples the stage has done so far.")
    samples_target: int | None = Field(default=None, description="Samples it is to do, where it knows.")
    step: int | None = Field(default=None, description="The trainer's global step.")
    epochs_completed: int | None = Field(default=None, description="Epochs the trainer has finished.")
    loss: float | None = Field(default=None, description="The last logged train/loss.")
    metrics: dict[str, float] | None = Field(default=None, description="The last logged train/* and val/* values.")
    eta_seconds: int | None = Field(default=None, description="Estimated seconds until the stage ends.")
    updated: str | None = Field(default=None, description="When the live values last changed.")


class SweepBest(Model):
    """The fastest K at one measured concurrency."""

    concurrency: int = Field(description="Closed-loop clients sending at once.")
    best_k: int = Field(description="The fastest K measured at this concurrency (0: plain decoding).")
    tokens_per_second: float | None = Field(default=None, description="Output tokens/s with the best K.")
    plain_tokens_per_second: float | None = Field(
        default=None, description="Output tokens/s of plain decoding (no draft) at the same concurrency."
    )
    speedup: float | None = Field(default=None, description="The best K's throughput over plain decoding's.")


class SweepSummary(Model):
    """What the sweep measured, in short (the whole curve is in the published provenance record)."""

    device: str | None = Field(default=None, description="The device class the servers ran on (cpu, or the GPU's).")
    ks: list[int] | None = Field(default=None, description="The speculative Ks measured besides plain decoding.")
    best: list[SweepBest] | None = Field(default=None, description="The fastest K per concurrency measured.")
    crossover: int | None = Field(
        default=None, description="The lowest concurrency from which plain decoding was as fast as every K."
    )
    digest: str | None = Field(default=None, description="sha256 of the curve as published.")
    failed_at: dict[str, int] | None = Field(
        default=None, description="The point ({k, concurrency}) a failed sweep reached; nothing was published."
    )


class EvaluationResult(Model):
    """What the evaluate stage measured (vLLM's spec-decode counters over the evaluated requests)."""

    outcome: str | None = Field(
        default=None, description="Passed, AcceptanceBelowThreshold, ZeroDrafts or EvaluationServerNotReady."
    )
    prompts: int | None = Field(default=None, description="Prompts evaluated.")
    tokens: int | None = Field(default=None, description="Tokens generated over the evaluated requests.")
    k: int | None = Field(default=None, description="K the draft was evaluated with.")
    drafts: int | None = Field(default=None, description="Verification steps with drafts over the evaluated requests.")
    rate: float | None = Field(default=None, description="Accepted / drafted tokens.")
    mean_accepted_length: float | None = Field(default=None, description="1 + accepted / drafts (1..K+1).")
    alpha: float | None = Field(
        default=None, description="Per-position acceptance α solving E(α, K) = meanAcceptedLength (not the rate)."
    )
    per_position: list[float] | None = Field(
        default=None, description="Drafts whose first p+1 tokens were accepted / drafts, p = 0..K-1."
    )
    predicted_speedup: float | None = Field(
        default=None, description="E(α, K) / (1 + n·c) at the evaluated K (n: draft forwards per step)."
    )
    cost_ratio: float | None = Field(
        default=None,
        description="c: the draft's cost per forward relative to the verifier's (docs/concepts/economics.md).",
    )
    min_acceptance: float | None = Field(default=None, description="The evaluation.minAcceptance it was held to.")
    min_speedup: float | None = Field(default=None, description="The evaluation.minSpeedup it was held to.")
    seconds: float | None = Field(default=None, description="Wall time of the measuring client.")
    server_wait_seconds: int | None = Field(
        default=None, description="How long the evaluation server was waited for, when it never became ready."
    )
    timeout_seconds: int | None = Field(default=None, description="The evaluation.timeoutSeconds it was held to.")
    sweep: SweepSummary | None = Field(default=None, description="The throughput sweep, when evaluation.sweep asks.")


class CheckpointRef(Model):
    """The published checkpoint."""

    uri: str | None = Field(
        default=None, description="The exact, immutable location published to (a hub commit for hf://)."
    )
    digest: str | None = Field(default=None, description="sha256 over the published files (names and contents).")


class Retention(Model):
    """What output.keepLatest pruned after this run published (s3:// only)."""

    keep_latest: int | None = Field(default=None, description="The output.keepLatest applied.")
    deleted: list[str] = Field(default_factory=list, description="Published folders deleted after this run.")
    kept: list[str] = Field(default_factory=list, description="Older folders kept because something names them.")


class Provenance(Model):
    """What the draft was made from and with: the record published beside the checkpoint, in short."""

    release: str | None = Field(default=None, description="The pinned release the run used.")
    speculators: str | None = Field(default=None, description="Its speculators version.")
    hs_connectors: str | None = Field(default=None, description="Its hs-connectors version.")
    vllm: str | None = Field(default=None, description="Its vLLM version.")
    verifier_revision: str | None = Field(
        default=None, description="The verifier commit sha, or the digest of its s3 files (name, ETag, size)."
    )
    verifier_content: str | None = Field(default=None, description="The identity of the verifier files vLLM reads.")
    verifier_layers: int | None = Field(default=None, description="The verifier's num_hidden_layers.")
    verifier_model_type: str | None = Field(default=None, description="The verifier's config.json model_type.")
    verifier_max_positions: int | None = Field(
        default=None, description="The verifier's max_position_embeddings: the longest sequence it takes."
    )
    data_fingerprint: str | None = Field(default=None, description="prepare-data's dataset fingerprint.")
    converted_from: str | None = Field(default=None, description="The third-party draft converted (URI@revision).")
    evaluation: EvaluationResult | None = Field(default=None, description="The acceptance measured before publish.")
    commands: dict[str, str] | None = Field(default=None, description="Each stage's exact command line.")
    images: dict[str, str] | None = Field(
        default=None,
        description="Each finished stage's image as the kubelet ran it (containerStatuses[].imageID: the "
        "repository and the manifest digest).",
    )


class SpeculatorTrainJobStatus(Model):
    """What the operator observed and decided; written by the operator only."""

    phase: Phase | None = Field(
        default=None,
        description="Pending, then the running stage's phase (Regenerating, Preparing, Extracting, Training, "
        "Converting, Stitching, Auditing, Evaluating, Sweeping, Publishing), then Succeeded or Failed. The "
        "conditions say why; GitOps tools read those, not the phase.",
    )
    observed_generation: int | None = Field(
        default=None,
        description="The metadata.generation this status was written for; 0 before the operator's first pass.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Failed, Audited, Published, HandedOff, and the kstatus pair Reconciling / Stalled "
        "(docs/operations/troubleshooting.md lists their reasons).",
    )
    stage: str | None = Field(default=None, description="The stage running now (or the one that failed).")
    stages: list[StageStatus] = Field(
        default_factory=list, description="Every stage of the run, in order; those not started yet are Pending."
    )
    start_time: str | None = Field(default=None, description="RFC 3339 time the operator started the run.")
    completion_time: str | None = Field(default=None, description="RFC 3339 time the run succeeded or failed.")
    progress: Progress | None = None
    checkpoint: CheckpointRef | None = Field(default=None, description="The published checkpoint, once published.")
    audit: AuditSummary | None = Field(default=None, description="The trained (or converted) checkpoint's audit.")
    evaluation: EvaluationResult | None = None
    provenance: Provenance | None = Field(
        default=None, description="What the draft was made from and with (also published beside it)."
    )
    retention: Retention | None = Field(
        default=None, description="What output.keepLatest pruned after the publish (s3:// only)."
    )
    deployed_to: str | None = Field(
        default=None, description="The SpeculatorDeployment the published checkpoint was handed to (spec.deployTo)."
    )
