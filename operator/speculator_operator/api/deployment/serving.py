"""How vLLM serves the pair (spec.serving): replicas, parallelism, K, the cutoff, the pods' settings, and what the
operator does with the acceptance it measures (tuning)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from speculator_operator.api.common import Model
from speculator_operator.api.deployment.rules import OWNED_FLAGS, extra_args_schema
from speculator_operator.api.parallelism import Parallelism, layout
from speculator_operator.domain.parallelism import Layout


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
        # `name` typed for CEL (a rule reads it: api/deployment/rules.py); the rest as Kubernetes has it
        json_schema_extra={
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"name": {"type": "string", "description": "The variable's name."}},
            }
        },
    )

    @property
    def layout(self) -> Layout:
        return layout(self.parallelism, self.tensor_parallel_size)
