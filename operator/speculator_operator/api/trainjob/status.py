"""What the operator observed and decided for a SpeculatorTrainJob (its status, written by the operator only): the
run's phase and stages, live progress, the audit, the evaluation (and sweep) measured, and what was published."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speculator_operator.api.common import Condition, Model
from speculator_operator.api.deployment.status import AuditSummary

Phase = Literal[
    "Pending", "Regenerating", "Preparing", "Extracting", "Training", "Converting", "Stitching", "Auditing",
    "Evaluating", "Sweeping", "Publishing", "Succeeded", "Failed",
]  # fmt: skip
StagePhase = Literal["Pending", "Running", "Succeeded", "Failed"]


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
