"""What the operator observed and decided for a SpeculatorDeployment (its status, written by the operator only): the
audit (a SpeculatorTrainJob's status reports its own with the same AuditSummary), live acceptance, the pair's
economics, what Auto tuned, the served revision, and learning's state."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speculator_operator.api.canary import CanaryStatus
from speculator_operator.api.common import Condition, Model
from speculator_operator.api.learning import LearningStatus


class AuditSummary(Model):
    """The checkpoint audit's outcome against the verifier and the pinned vLLM (docs/concepts/audit.md)."""

    ok: bool = Field(description="True when no finding is an error: the checkpoint may be served (or published).")
    errors: int = Field(default=0, description="Findings of severity error (any refuses the checkpoint).")
    warnings: int = Field(default=0, description="Findings of severity warning (served anyway).")
    findings: list[dict[str, str]] = Field(
        default_factory=list, description="Up to 20 findings: rule, severity, message."
    )


class AcceptancePods(Model):
    """Which serving pods the window was measured on."""

    counted: int = Field(default=0, description="Ready pods of the served revision whose metrics were read.")
    other_revision: int | None = Field(default=None, description="Pods of another revision, not counted.")
    counter_resets: int | None = Field(default=None, description="Counter resets seen (restarted vLLM).")
    failing: list[dict[str, str]] | None = Field(
        default=None, description="Up to 10 pods whose metrics could not be used: pod, reason, message."
    )


class AcceptanceLoad(Model):
    """The load the window was measured under."""

    requests_running: float | None = Field(default=None, description="vllm:num_requests_running, summed.")
    generation_tokens_per_second: float | None = Field(
        default=None,
        description="Output tokens per second over the window, all counted pods together "
        "(vllm:generation_tokens_total).",
    )


class Acceptance(Model):
    """Live acceptance from vLLM's spec-decode counters over a sliding window (docs/concepts/telemetry.md)."""

    rate: float | None = Field(default=None, description="Accepted / drafted tokens.")
    percent: str | None = Field(default=None, description="The rate as a percentage (the printer column).")
    mean_accepted_length: float | None = Field(default=None, description="1 + accepted / drafts (1..K+1).")
    alpha: float | None = Field(
        default=None, description="Per-position acceptance α solving E(α, K) = meanAcceptedLength (not the rate)."
    )
    per_position: list[float] | None = Field(
        default=None, description="Drafts whose first p+1 tokens were accepted / drafts, p = 0..K-1."
    )
    k: int | None = Field(default=None, description="K as served.")
    drafts: int | None = Field(default=None, description="Verification steps with drafts in the window.")
    window_seconds: int | None = Field(
        default=None,
        description="Seconds the window's scrapes actually cover: up to serving.tuning.windowSeconds, less while the "
        "window fills (after an operator start or a new revision).",
    )
    observed_at: str | None = Field(default=None, description="When these values were computed and written.")
    revision: str | None = Field(default=None, description="The serving revision they belong to.")
    break_even_alpha: float | None = Field(default=None, description="α* for this pair's cost ratio and K.")
    predicted_speedup: float | None = Field(default=None, description="E(α, K) / (1 + n·c) at the served K.")
    recommended_k: int | None = Field(default=None, description="The K with the best predicted speedup.")
    cost_source: Literal["prior", "parameters", "sweep", "live"] | None = Field(
        default=None, description="Where the draft cost behind the three figures above comes from."
    )
    cost_ratio: float | None = Field(default=None, description="That cost: c in E(α, K) / (1 + n·c).")
    step_ms: float | None = Field(
        default=None, description="Live: the window's mean step time a request saw (vLLM's inter-token latency)."
    )
    plain_step_ms: float | None = Field(
        default=None, description="Live: the sweep's plain-decoding step time at the same batch, on this device class."
    )
    batch: float | None = Field(default=None, description="Live: the window's mean decoding requests per engine step.")
    note: str | None = Field(
        default=None, description="Why the figures cannot be judged yet (e.g. fewer drafts than tuning.minSamples)."
    )
    pods: AcceptancePods | None = Field(default=None, description="Which serving pods the window was measured on.")
    basis: Literal["Drafts", "AdaptiveVerification"] | None = Field(
        default=None,
        description="What the counters mean. Drafts: every draft token is verified, so rate, meanAcceptedLength and α "
        "describe the draft. AdaptiveVerification: vLLM verified only the slots it expected to pay and counts the "
        "others as drafted and not accepted, so rate is a lower bound of the draft's, meanAcceptedLength is the "
        "tokens each step gained, α and the modelled speedup are not given, and predictedSpeedup is measured: "
        "meanAcceptedLength × plainStepMs / stepMs.",
    )
    load: AcceptanceLoad | None = Field(default=None, description="The load the window was measured under.")


class SweepRef(Model):
    job: str | None = Field(default=None, description="The train job whose evaluate stage measured it.")
    device: str | None = Field(default=None, description="The device class it ran on.")
    digest: str | None = Field(default=None, description="sha256 of the curve (the published provenance record's).")


class LoadEconomics(Model):
    """A device class load model (docs/concepts/economics.md): how a verifier step and a draft forward grow with the
    requests in flight, in milliseconds."""

    verifier_fixed_ms: float = Field(description="A verifier step's fixed time: launches and its weight reads.")
    verifier_token_ms: float = Field(description="What each token in the step adds: its arithmetic.")
    verifier_request_ms: float = Field(
        description="What each request in flight adds: reading its KV cache over the context it is assumed to hold."
    )
    draft_fixed_ms: float = Field(description="A draft forward's fixed time: launches and its weight reads.")
    draft_token_ms: float = Field(description="What each token in the draft forward adds.")
    draft_request_ms: float = Field(description="What each request in flight adds to a draft forward (its KV reads).")


class PairEconomics(Model):
    cost_ratio: float | None = Field(
        default=None,
        description="The draft's cost per forward relative to a verifier step before any measurement: the prior's "
        "(prior names its device class row); operators before the prior wrote draft / verifier parameters here.",
    )
    prior: str | None = Field(
        default=None,
        description="The prior that priced costRatio: its device class row (h100, h200, b200, a100, l40s, …), "
        "default for a GPU it does not know or a deployment that does not say, or cpu (the parameter ratio).",
    )
    parameter_ratio: float | None = Field(
        default=None, description="Draft / verifier parameters touched per token, for comparison."
    )
    max_k: int | None = Field(default=None, description="The checkpoint's speculative_tokens.")
    source: Literal["prior", "parameters", "sweep", "live"] | None = Field(
        default=None,
        description="Where the cost behind breakEvenAlpha, predictedSpeedup and recommendedK comes from: the device "
        "class prior (prior), the draft's measured sweep (on this device class), or live step times against the "
        "sweep's; parameters (parameter counts) is what operators before the prior wrote.",
    )
    effective_cost_ratio: float | None = Field(
        default=None, description="The draft's cost per forward relative to a plain step, as measured (sweep or live)."
    )
    schedule_from: (
        Literal["adaptiveVerification", "numSpeculativeTokens", "cutoff", "tuning", "sweep", "checkpoint"] | None
    ) = Field(
        default=None,
        description="What set the served K and schedule, in precedence order: adaptive verification (vLLM per step, "
        "no schedule), the spec's K, its cutoff, Auto tuning, the measured sweep, else the checkpoint's K at every "
        "batch size.",
    )
    sweep: SweepRef | None = Field(default=None, description="The measured sweep used, where one is.")
    plain_steps: list[list[float]] | None = Field(
        default=None,
        description="The sweep's plain-decoding step time per batch ([batch, ms] pairs): what live step times are "
        "held against.",
    )
    note: str | None = Field(default=None, description="Why a measured sweep is not used, where the draft has one.")
    load_model: LoadEconomics | None = Field(
        default=None,
        description="The device class load model (the row prior names) that prices Auto tuning's per-batch-size "
        "schedule: how the steps grow with the requests in flight, the draft's batch-1 cost staying the one source "
        "names. Absent where the saturation model prices it (prior cpu: serving.tuning.saturationTokens).",
    )


class TuningPending(Model):
    k: int = Field(description="The K the evidence points to (0: speculation off).")
    since: str = Field(description="Since when the evidence has pointed there without a break.")
    evidence: str | None = Field(default=None, description="The measured figures behind it (α, drafts, speedups).")


class TuningStatus(Model):
    """What Auto tuned and why (the spec is never written: GitOps would revert it)."""

    mode: str | None = Field(default=None, description="The tuning mode this state belongs to.")
    k: int | None = Field(default=None, description="The tuned K the served revision renders (0: speculation off).")
    schedule: list[list[int]] | None = Field(
        default=None, description="The tuned num_speculative_tokens_per_batch_size ([start, end, K] triples)."
    )
    applied_at: str | None = Field(default=None, description="When the last tuned revision was rolled out.")
    evidence: str | None = Field(default=None, description="The numbers the last rollout acted on.")
    rollouts: int | None = Field(default=None, description="Revisions Auto has rolled out for this resource.")
    pending: TuningPending | None = Field(default=None, description="A change waiting for minIntervalSeconds.")
    probe_at: str | None = Field(default=None, description="While speculation is off: when a probe revision rolls.")
    probe_k: int | None = Field(default=None, description="The K a probe revision speculates with.")
    probing: bool | None = Field(default=None, description="The served revision is a probe (speculation was off).")
    note: str | None = Field(
        default=None,
        description="Why Auto does not act now: numSpeculativeTokens is set in the spec, or a tuned revision waits "
        "(a retraining or a canary in flight, a paused verifier or draft change, the deployment not served).",
    )


class RetrainStatus(Model):
    job: str = Field(description="The SpeculatorTrainJob training a draft for the new verifier revision.")
    verifier_revision: str = Field(description="The verifier revision it trains for.")


class ServedImage(Model):
    revision: str = Field(description="The serving revision whose pods ran it.")
    image: str = Field(description="The image the pods were rendered with (reference@digest where pinned).")
    image_id: str = Field(
        description="The image the kubelet ran (containerStatuses[].imageID: the repository and the manifest "
        "digest), the same on every ready pod of the revision."
    )


class RenderNote(Model):
    """A choice the render made on its own (a default it filled, a flag the release needs), said in status."""

    reason: str = Field(
        description="What it chose: ScheduleOff (data parallelism above 1: one K at every batch size), "
        "CutoffUnsupported (the pinned vLLM has no per-batch-size schedule) or SpeculationOff (tuning or the "
        "measured sweep switched speculation off)."
    )
    message: str = Field(description="The choice and why, in words.")


class HandedOver(Model):
    """A train job's published output that this deployment serves because the job names it (`spec.deployTo`): kept
    in status, so that no spec is written and a GitOps tool that re-applies the manifests from git undoes nothing."""

    train_job: str = Field(description="The SpeculatorTrainJob whose spec.deployTo names this deployment.")
    uri: str = Field(description="The exact location it published.")
    credentials: str | None = Field(default=None, description="The Secret that reads it (its output.credentials).")
    completion_time: str | None = Field(default=None, description="When the train job succeeded.")
    speculator: str = Field(
        description="A digest of spec.speculator when it was taken: an edit of spec.speculator supersedes it."
    )


class ServingState(Model):
    """What the serving workload says of one revision (planning/deployment.py `serving_status`): the status carries
    it as replicas, readyReplicas and updatedReplicas and as the Serving condition (ready, reason, problem). Not a
    field of the status itself."""

    ready: bool = Field(description="Every wanted replica of the revision is updated, available and alone.")
    reason: str = Field(description="The Serving condition's reason (RolledOut, RollingOut, a stuck pod's, ...).")
    replicas: int = Field(description="Replicas wanted.")
    ready_replicas: int = Field(description="Ready replicas (ready groups on LeaderWorkerSet).")
    updated_replicas: int = Field(description="Replicas at the revision (whole groups on LeaderWorkerSet).")
    problem: str | None = Field(default=None, description="Why it is stuck, in the kubelet's or API server's words.")


class Requests(Model):
    """The last value of each one-shot request annotation the operator acted on (planning/requests.py)."""

    resolve: str | None = Field(default=None, description="speculators.dev/resolve-requested, last acted on.")
    retrain: str | None = Field(default=None, description="speculators.dev/retrain-requested, last acted on.")
    resume: str | None = Field(default=None, description="speculators.dev/resume-requested, last acted on.")


class SpeculatorDeploymentStatus(Model):
    """What the operator observed and decided; written by the operator only."""

    phase: Literal["Pending", "Auditing", "Deploying", "Ready", "Degraded", "Failed"] | None = Field(
        default=None,
        description="Pending (waiting for an input: a train job, a readable checkpoint or verifier), Auditing, "
        "Deploying (children applied, not every replica of the current revision ready), Ready, Degraded (the new "
        "pair cannot be served while the last good pair keeps serving), Failed (nothing can be served). The "
        "conditions say why; GitOps tools read those, not the phase.",
    )
    observed_generation: int | None = Field(
        default=None,
        description="The metadata.generation this status was written for; 0 before the operator's first pass.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Audited, VerifierCurrent, DraftCurrent, Serving, SpeculationEffective, and the kstatus "
        "pair Reconciling / Stalled (docs/operations/troubleshooting.md lists their reasons).",
    )
    release: str | None = Field(default=None, description="The pinned release the pair is served with.")
    release_level: Literal["Served", "Checked"] | None = Field(
        default=None,
        description="How far the project has proven that release (`speculator-operator releases`): Served, served end "
        "to end on vLLM's CPU build in every CI run; Checked, qualified without a device and never served by the "
        "project (event ReleaseChecked).",
    )
    vllm: str | None = Field(default=None, description="The vLLM version of that release.")
    algorithm: str | None = Field(
        default=None,
        description="The draft's algorithm as the audit read it from the checkpoint (eagle3, dflash, ...).",
    )
    num_speculative_tokens: int | None = Field(
        default=None, description="K as served: drafted tokens per step (0: speculation off)."
    )
    verifier_revision: str | None = Field(
        default=None, description="The verifier commit sha, or the digest of its s3 files (name, ETag, size)."
    )
    draft_revision: str | None = Field(
        default=None, description="The draft commit sha, or the digest of its s3 files (name, ETag, size)."
    )
    draft_source: str | None = Field(
        default=None,
        description="The exact location served: a train job's published location (fromTrainJob), or where an "
        "output.uri's pointer led.",
    )
    retrain: RetrainStatus | None = Field(default=None, description="A retraining in flight.")
    requests: Requests | None = Field(
        default=None, description="The request annotations acted on (each acted on once per value)."
    )
    handed_over: HandedOver | None = Field(
        default=None, description="A train job's output served in place of spec.speculator (its spec.deployTo)."
    )
    revision: str | None = Field(
        default=None,
        description="Hash of verifier, draft, release, the server image (its digest where pinned) and "
        "the rendered config.",
    )
    render_notes: list[RenderNote] | None = Field(
        default=None,
        description="What the render of the served revision chose on its own; the Serving condition says them too.",
    )
    served_image: ServedImage | None = Field(
        default=None, description="What the kubelet reports running for the served revision (recorded once rolled out)."
    )
    replicas: int | None = Field(
        default=None,
        description="Replicas wanted for the served revision (serving.replicas, less an InPlace canary's share).",
    )
    ready_replicas: int | None = Field(
        default=None, description="Ready replicas of the serving Deployment (ready groups on LeaderWorkerSet)."
    )
    updated_replicas: int | None = Field(default=None, description="Replicas already at the served revision.")
    audit: AuditSummary | None = Field(default=None, description="The served draft's audit.")
    acceptance: Acceptance | None = None
    economics: PairEconomics | None = Field(
        default=None,
        description="What speculation costs for this pair and where K and the schedule come from "
        "(docs/concepts/economics.md).",
    )
    tuning: TuningStatus | None = None
    canary: CanaryStatus | None = Field(default=None, description="The canary in flight, or the last one's verdict.")
    learning: LearningStatus | None = Field(
        default=None,
        description="What learning captured, its live baseline, the last trigger and the running or last learning "
        "run (docs/concepts/learning.md). Set, empty for now, while spec.learning is; removed with it.",
    )
