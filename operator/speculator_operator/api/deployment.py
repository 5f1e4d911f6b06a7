"""SpeculatorDeployment: a verifier + draft pair served by vLLM, audited before any pod exists."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from speculator_operator.api.canary import Canary, CanaryStatus
from speculator_operator.api.common import Condition, Model, SecretRef
from speculator_operator.api.parallelism import PARALLEL_FLAGS, Parallelism, layout, layout_rules
from speculator_operator.domain.location import Location, Scheme
from speculator_operator.domain.parallelism import Layout

# what a draft served by vLLM can be (speculators_model_type; mtp: a head stitched into its verifier), spelled out
# for the schema (tests/unit/test_one_table.py checks it against the algorithm table)
DeclaredAlgorithm = Literal["eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp"]

# Flags the operator renders itself; extraArgs may not touch them (the CRD's CEL rule says the same).
OWNED_FLAGS = (
    "--model", "--served-model-name", "--speculative-config", "-sc", "--spec-method", "--spec-model",
    "--spec-tokens", "--tensor-parallel-size", "-tp", "--port", "--host", "--shutdown-timeout",
    "--max-num-seqs", "--quantization", "-q", "--revision", "--tokenizer", *PARALLEL_FLAGS,
)  # fmt: skip


def extra_args_schema(owned: tuple[str, ...]) -> dict[str, Any]:
    """The CRD schema of an extraArgs list: strings that touch none of `owned` (nor the removed
    disable_by_batch_size), checked by the API server (CEL)."""
    pattern = "^(" + "|".join(owned) + ")(=.*)?$"  # a hyphen needs no escape outside [...]
    return {
        "items": {"type": "string", "maxLength": 1024},
        "x-kubernetes-validations": [
            {
                "rule": f"self.all(a, !a.matches('{pattern}') && !a.contains('disable_by_batch_size'))",
                "message": "extraArgs may not set flags the operator renders (" + ", ".join(owned) + ") "
                "nor disable_by_batch_size (removed in vLLM 0.17; use cutoff)",
            }
        ],
    }


class Verifier(Model):
    """The target model the draft speculates for."""

    model: str = Field(
        min_length=1,
        max_length=512,
        pattern=r"^((hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+|s3://[a-z0-9][a-z0-9.-]*(/.*)?|pvc://[a-z0-9][a-z0-9.-]*(/.*)?)$",
        description="Hugging Face repo id (org/name or hf://org/name), s3://bucket/prefix, or pvc://claim/path.",
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        description="Branch, tag or commit of a hub model; the operator resolves it to a commit sha. "
        "For s3:// the revision is a digest over every file vLLM reads (name, ETag, size); pvc:// is not read "
        "by the operator.",
    )
    quantization: str | None = Field(default=None, max_length=64, description="vLLM --quantization for the verifier.")
    credentials: SecretRef | None = Field(
        default=None,
        description="Secret with HF_TOKEN and/or AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL.",
    )

    @property
    def location(self) -> Location:
        """The model's location (a bare org/name is a hub id)."""
        return Location.parse(self.model, bare=Scheme.HUB)

    @property
    def is_hub(self) -> bool:
        return self.location.is_hub

    @property
    def uri(self) -> str:
        """hf://org/name, s3://..., or pvc://... (a bare org/name is a hub id)."""
        return self.location.uri

    @property
    def config_location(self) -> str | None:
        """Where the operator reads the verifier's config.json (pinned to `revision` on the hub); None
        for pvc://, which only the pods mount."""
        if self.location.is_pvc:
            return None
        return f"{self.uri}@{self.revision}" if self.is_hub else self.model


class Speculator(Model):
    """The draft: exactly one of source or fromTrainJob."""

    source: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^(hf://[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?|s3://[a-z0-9][a-z0-9.-]*(/.*)?|pvc://[a-z0-9][a-z0-9.-]*(/.*)?)$",
        description="Draft checkpoint: hf://org/repo[@revision], s3://bucket/prefix or pvc://claim/path. An s3:// "
        "prefix that holds a train job's `speculators-latest.json` pointer (its output.uri) is resolved to the "
        "exact location the pointer names when it is audited.",
    )
    from_train_job: str | None = Field(
        default=None,
        max_length=253,
        description="Name of a SpeculatorTrainJob in this namespace whose output to serve.",
    )
    credentials: SecretRef | None = Field(default=None, description="Secret for the draft's storage (as verifier).")
    algorithm: DeclaredAlgorithm | None = Field(
        default=None,
        description="The draft's algorithm as you expect it (its speculators_model_type; mtp for an MTP head "
        "stitched into its verifier). Optional: the audit refuses a checkpoint that says otherwise (rule "
        "declared-draft), so a hub branch that moves cannot swap the kind of draft served, and an offline "
        "`speculator-operator render` (no network, or a train job not yet published) renders from it.",
    )
    speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="The checkpoint's speculative_tokens as you expect it (an MTP model's layer count), for an "
        "offline render; the audit warns (rule declared-draft) where the checkpoint says otherwise. Not the "
        "served K: that is serving.numSpeculativeTokens (auto: the checkpoint's own).",
    )


class Cutoff(Model):
    """Speculation is switched off for scheduler steps with more than maxBatchSize requests."""

    max_batch_size: int = Field(ge=1, le=65536, description="Largest batch that still speculates.")


class Tuning(Model):
    """What the operator does with the live acceptance it measures (docs/concepts/telemetry.md,
    docs/concepts/tuning.md)."""

    mode: Literal["Off", "Recommend", "Auto"] = Field(
        default="Recommend",
        description="Recommend: status.acceptance.recommendedK from the measured acceptance (nothing rolls); "
        "Auto: where numSpeculativeTokens is auto, the operator rolls out a new revision with the tuned K and "
        "per-batch-size schedule (kept in status.tuning, never in the spec) once the evidence has held for "
        "minIntervalSeconds; Off: acceptance is measured and judged, nothing is recommended.",
    )
    min_samples: int = Field(
        default=200, ge=1, le=10_000_000, description="Drafts in the window before acceptance is judged."
    )
    window_seconds: int = Field(default=300, ge=30, le=86400, description="The sliding window acceptance covers.")
    min_k: int = Field(default=1, ge=1, le=64, description="Auto never tunes K below this.")
    max_k: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Auto never tunes K above this (default and upper limit: the checkpoint's speculative_tokens).",
    )
    min_interval_seconds: int = Field(
        default=1800,
        ge=0,
        le=604800,
        description="Auto rolls out only evidence that has held this long, and at most once per this interval.",
    )
    hysteresis: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Auto changes K only when the new K's predicted speedup beats the served K's by this fraction.",
    )
    allow_disable: bool = Field(
        default=False,
        description="Auto may switch speculation off (a revision without --speculative-config) while the measured "
        "acceptance is below break-even at every K; a probe revision measures it again every probeIntervalSeconds.",
    )
    probe_interval_seconds: int = Field(
        default=21600,
        ge=10,
        le=604800,
        description="How long speculation stays off before a probe revision speculates again to measure.",
    )
    saturation_tokens: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="On a CPU (status.economics.prior cpu): tokens per verifier step beyond which the verifier's "
        "step grows linearly, where the tuned per-batch-size schedule lowers K. A GPU's schedule is priced by its "
        "device class load model (status.economics.loadModel) and does not use it.",
    )


class Serving(Model):
    """How vLLM serves the pair."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description="Serving replicas (0..1024, default 1): pods, or LeaderWorkerSet groups when parallelism.nodes is "
        "above 1. 0 runs no serving pod (Serving reason ScaledToZero).",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="Tensor-parallel size of the verifier (the same as parallelism.tensor)."
    )
    parallelism: Parallelism | None = Field(
        default=None,
        description="Pipeline, data and node counts per replica (and tensor, as tensorParallelSize). One node by "
        "default; nodes above 1 serve each replica as one LeaderWorkerSet group.",
    )
    num_speculative_tokens: int | Literal["auto"] = Field(
        default="auto",
        description="K, drafted tokens per step (1..64), or auto: the checkpoint's own speculative_tokens.",
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? (self >= 1 && self <= 64) : self == 'auto'",
                    "message": "numSpeculativeTokens must be an integer in 1..64 or 'auto'",
                }
            ],
        },
    )
    cutoff: Cutoff | None = Field(default=None, description="Switch speculation off above a batch size.")
    adaptive_verification: bool | None = Field(
        default=None,  # no schema default: an object written by this operator stays readable by one without the field
        description="Off unless true. vLLM's enable_adaptive_verification: each engine step verifies only the draft "
        "slots its confidence says will pay, 0..K per request (DSpark; DFlash2 from vLLM 0.34; the V2 model runner, "
        "full CUDA graphs, no LoRA, pipeline parallel 1). vLLM then decides per step, so the per-batch-size schedule "
        "and K tuning stand down, and the spec-decode counters count a trimmed draft token as drafted and not "
        "accepted: status.acceptance.basis says so, α and the modelled speedup are not given, and the speedup is "
        "measured from live step times instead (docs/concepts/telemetry.md).",
    )
    max_num_seqs: int = Field(default=256, ge=1, le=65536, description="vLLM --max-num-seqs.")
    served_model_name: str | None = Field(
        default=None, max_length=253, description="Name clients use; default: the resource name."
    )
    resources: dict[str, dict[str, int | str]] | None = Field(
        default=None,
        description="Container resources (limits/requests) of each pod; GPUs default to the pod's share of the "
        "layout: tensor × pipeline × data / nodes.",
    )
    node_selector: dict[str, str] | None = Field(
        default=None,
        description="The serving pods' nodeSelector (label: value), e.g. nvidia.com/gpu.product: "
        "NVIDIA-H100-80GB-HBM3; its nvidia.com/gpu.product also names the device class when deviceClass is unset.",
    )
    device_class: str | None = Field(
        default=None,
        max_length=128,
        description="The accelerator the replicas run on, as a sweep names it (e.g. NVIDIA H100 80GB HBM3, or cpu): a "
        "draft's measured sweep is used only on the device class it ran on. Default: nodeSelector's "
        "nvidia.com/gpu.product (GPU feature discovery's label), else cpu where the pods ask for no GPU.",
    )
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        description="The serving pods' tolerations (Kubernetes Toleration objects: key, operator, value, effect, "
        "tolerationSeconds), e.g. for a tainted GPU node pool.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More vLLM arguments; flags the operator owns are refused.",
        json_schema_extra=extra_args_schema(OWNED_FLAGS),
    )
    shutdown_timeout_seconds: int = Field(
        default=60, ge=0, le=3600, description="vLLM drains this long on SIGTERM; the pod's grace period is longer."
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="The server image (default: the release's, `speculator-operator images`), e.g. its cpu variant "
        "for CPU nodes or a copy in one's own registry. It must hold this package and the release's vLLM.",
    )
    tuning: Tuning = Field(
        default_factory=Tuning,
        json_schema_extra={
            "default": {},
            "x-kubernetes-validations": [
                {"rule": "!has(self.maxK) || self.minK <= self.maxK", "message": "tuning.minK must not exceed maxK"}
            ],
        },
    )
    env: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=64,
        description="More environment variables for vLLM (name/value or valueFrom), e.g. VLLM_CPU_KVCACHE_SPACE.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )

    @property
    def layout(self) -> Layout:
        return layout(self.parallelism, self.tensor_parallel_size)


class UpgradePolicy(Model):
    """What happens when an input moves under the same spec: the verifier's or the draft's revision, or a new draft
    revision to try as a canary."""

    on_verifier_change: Literal["Redeploy", "Retrain", "Pause"] = Field(
        default="Redeploy",
        description="Redeploy: re-audit and roll verifier and draft together; Retrain: train a new draft first; "
        "Pause: report VerifierCurrent=False and change nothing.",
    )
    on_draft_change: Literal["Redeploy", "Pause"] = Field(
        default="Redeploy",
        description="When the draft's bytes move under the same source (files replaced in place, a pointer moved "
        "to a new publish): Redeploy audits the new draft and rolls the pair out together; Pause reports "
        "DraftCurrent=False and changes nothing.",
    )
    poll_interval_seconds: int = Field(
        default=600, ge=30, le=86400, description="How often the verifier and draft revisions are resolved again."
    )
    canary: Canary | None = Field(
        default=None,
        description="Roll a new draft revision (the verifier unchanged) out as a canary judged on live acceptance "
        "against the incumbent; promoted or rolled back by the operator. Off when unset; `canary: {}` turns it on "
        "with the defaults (docs/concepts/canary.md).",
    )
    train_template: dict[str, Any] | None = Field(
        default=None,
        description="A SpeculatorTrainJob spec without verifier and deployTo: what Retrain runs (and Redeploy "
        "when the draft fails its audit against the new verifier). The operator adds the verifier pinned to the "
        "new revision and deployTo this deployment; the current pair keeps serving until the new draft passes.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class AuditPolicy(Model):
    """What the checkpoint audit accepts (docs/concepts/audit.md)."""

    allow_lossy: bool = Field(default=False, description="Accept lossy proposals (verifier_accept_k > 1, ...).")


ADAPTIVE_RULE: dict[str, Any] = {
    "rule": "!has(self.adaptiveVerification) || !self.adaptiveVerification || !has(self.cutoff)",
    "message": "serving.adaptiveVerification trims verification per step: it and a serving.cutoff schedule cannot "
    "both decide K",
}


class SpeculatorDeploymentSpec(Model):
    """The verifier, its draft, how they are served, and what happens when either moves."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.serving.adaptiveVerification) || !self.serving.adaptiveVerification "
        "|| !has(self.upgradePolicy.canary) "
        "|| self.upgradePolicy.canary.metric == 'MeanAcceptedLength'",
        "message": "with serving.adaptiveVerification vLLM verifies a varying share of each draft, so α is not "
        "measured: a canary compares MeanAcceptedLength (upgradePolicy.canary.metric)",
        "fieldPath": ".upgradePolicy.canary.metric",
    }]})  # fmt: skip

    verifier: Verifier
    speculator: Speculator = Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.source) != has(self.fromTrainJob)",
                    "message": "set exactly one of speculator.source or speculator.fromTrainJob",
                }
            ]
        }
    )
    release: str | None = Field(default=None, max_length=64, description="Pinned release; default: the default one.")
    # `default: {}` lets the API server fill in the nested defaults when the block is left out
    serving: Serving = Field(
        default_factory=Serving,
        json_schema_extra={"default": {}, "x-kubernetes-validations": [*layout_rules("serving"), ADAPTIVE_RULE]},
    )
    upgrade_policy: UpgradePolicy = Field(
        default_factory=UpgradePolicy,
        description="What happens when the verifier or the draft moves under the same spec, and the canary.",
        json_schema_extra={"default": {}},
    )
    audit: AuditPolicy = Field(
        default_factory=AuditPolicy,
        description="What the checkpoint audit accepts (docs/concepts/audit.md).",
        json_schema_extra={"default": {}},
    )


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
