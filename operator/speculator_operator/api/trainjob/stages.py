"""How a SpeculatorTrainJob's stages run: the stages' pods, the shared workspace, the hidden-state extraction servers,
the trainer, the evaluate stage (and its sweep), and where the publish stage writes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from speculator_operator.api.common import Model, SecretRef
from speculator_operator.api.deployment.rules import OWNED_FLAGS, extra_args_schema
from speculator_operator.api.parallelism import Parallelism, layout
from speculator_operator.domain.parallelism import Layout

# the extraction server's own flags on top of the serving ones
SERVER_OWNED_FLAGS = (*OWNED_FLAGS, "--kv-transfer-config", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
                      "--enable-scale-out")  # fmt: skip


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
