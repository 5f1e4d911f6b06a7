"""A draft that keeps learning from the traffic it serves: `spec.learning` and `status.learning`
(docs/concepts/learning.md). The trigger that reads them is pure and lives in planning/learning.py; the CEL rules
between learning and the rest of the spec live with the spec's other cross-field rules (api/deployment/rules.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from speculator_operator.api.common import Model, SecretRef

# the threshold BelowThreshold compares with when the spec leaves it out
DEFAULT_THRESHOLD = 0.5
LearningReason = Literal["Drift", "Samples", "Requested"]
RunState = Literal["Running", "Succeeded", "Failed"]


def at_least(minimum: float, field: str) -> dict[str, Any]:
    """A CEL rule for a share's fractional lower bound. The schema's `minimum` alone lets a JSON integer 0 through:
    the API server compares an integer value with the minimum truncated to an integer (0.0001 -> 0)."""
    return {
        "x-kubernetes-validations": [{"rule": f"self >= {minimum}", "message": f"{field} must be at least {minimum}"}]
    }


class Redaction(Model):
    """One redaction: a sampled request any of whose texts (messages or prompt, tools, completion) matches
    `pattern` is not captured at all: a row is the exact token ids, which carry the same text, and the pod has no
    tokenizer to encode a rewritten text again (docs/concepts/learning.md)."""

    pattern: str = Field(
        min_length=1,
        max_length=512,
        description="A Python regular expression (the capture runs in the serving pod's Python), matched on "
        "the serving path of sampled requests: a pattern that backtracks (such as (a+)+$) slows every response "
        "of that server. A pattern the pod cannot compile captures nothing rather than writing unredacted text.",
    )


class Capture(Model):
    """Which served requests are captured. Picked up live: a change of this block reaches the running serving
    pods without a restart (they read it from a ConfigMap the operator writes)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.threshold) || self.mode == 'BelowThreshold'",
        "message": "capture.threshold applies to mode BelowThreshold only (mode All captures every sampled request)",
        "fieldPath": ".threshold",
    }]})  # fmt: skip

    fraction: float = Field(
        default=0.1,
        ge=0.0001,
        le=1,
        description="The share of eligible requests sampled, 0.0001..1 (default 0.1). Eligible: answered with "
        "status 200 by lossless decoding of the verifier's own text; docs/concepts/learning.md lists what is "
        "skipped (LoRA adapters, beam search, an assistant prefill, ...).",
        json_schema_extra=at_least(0.0001, "capture.fraction"),
    )
    mode: Literal["All", "BelowThreshold"] = Field(
        default="All",
        description="All: every sampled request; BelowThreshold: only those whose own draft acceptance (vLLM's "
        "per-request draft_acceptance_rate) is below threshold, the requests the draft serves worst.",
    )
    threshold: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="With mode BelowThreshold: the per-request draft acceptance rate (accepted / drafted tokens) "
        "below which a sampled request is captured; default 0.5. Refused with mode All.",
    )
    max_per_hour: int = Field(
        default=3600,
        ge=1,
        le=10_000_000,
        description="At most this many captured requests per hour for the whole deployment, not per pod: each "
        "of R capturing pods takes floor(maxPerHour / R), shared again among the pod's vLLM API-server processes "
        "(each captures on its own), so the total never exceeds it; a share below 1 captures nothing.",
    )
    redact: list[Redaction] | None = Field(
        default=None,
        max_length=32,
        description="Up to 32 patterns checked in the pod against every text of a sampled request (prompts, "
        "tools, the completion): a request that matches any is not captured and nothing of it is written (its "
        "token ids carry the same text); a match in the request is found before it is sent on, one in the "
        "completion once the response is whole. With patterns set, a prompt given as token ids is not captured "
        "either.",
    )

    @property
    def effective_threshold(self) -> float | None:
        """The threshold BelowThreshold compares with (None with mode All)."""
        if self.mode != "BelowThreshold":
            return None
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold


class Storage(Model):
    """Where captured samples are written. A change of the location or the credentials rolls the serving pods (what
    they mount changes); retentionDays is picked up live."""

    location: str = Field(
        max_length=512,
        # no "." or ".." segment: a pvc:// path stays under the claim's mount
        pattern=r"^(s3://[a-z0-9][a-z0-9.-]*/.+|"
        r"pvc://[a-z0-9][a-z0-9.-]*(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))+/?)$",
        description="s3://bucket/prefix or pvc://claim/path: shards are written under it, keyed by deployment, "
        "verifier revision, draft revision and time. hf:// is refused: captured traffic is user data and goes "
        "only to storage you control, and a hub repository is a publication.",
    )
    credentials: SecretRef | None = Field(
        default=None,
        description="A Secret with AWS_* keys for s3://, mounted in the serving pods as files. Give it put, list "
        "and delete on the prefix only (the pods write shards and delete expired ones); the learning run reads "
        "the shards with upgradePolicy.trainTemplate's own credentials. A missing or unreadable Secret stops the "
        "capture, never serving; once it is there the capture starts within a resync, without a rollout.",
    )
    retention_days: int = Field(
        default=30,
        ge=1,
        le=3650,
        description="Shards older than this many days (by their first row's time) are deleted by the serving "
        "pods, which check at start and hourly. Picked up live.",
    )


class Drift(Model):
    """Retrain when live acceptance falls below the draft's own live baseline on this traffic."""

    margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="In α units: a window counts as below when its α is below the baseline minus this margin.",
    )
    windows: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Consecutive counted windows below (baseline - margin) that make drift; a window at or above "
        "it starts the count again, so noise never triggers. A window is one canary interval "
        "(upgradePolicy.canary.intervalSeconds); one with fewer than upgradePolicy.canary.minDrafts drafts counts "
        "neither way.",
    )
    baseline_windows: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="The first counted windows after a draft revision starts serving (a promotion, or the first "
        "revision) whose drafts-weighted mean α is the live baseline: the draft's acceptance on this traffic, not "
        "the offline evaluation's.",
    )


class Trigger(Model):
    """When a learning run starts: new samples, and with `drift` also drift; never within the cooldown, during
    another learning run, a retraining, a verifier change or a canary."""

    drift: Drift | None = Field(
        default=None,
        description="Also require drift of live acceptance below its live baseline. Unset: new samples alone "
        "trigger. Refused with serving.adaptiveVerification, where α is not measured.",
    )
    min_new_samples: int = Field(
        default=1000,
        ge=1,
        le=100_000_000,
        description="Captured samples of the current verifier revision since the last learning run's snapshot, "
        "always required (with drift: drift and samples). After a learned draft is rolled back, as many new ones "
        "again before the next run.",
    )
    cooldown_seconds: int = Field(
        default=86400,
        ge=0,
        le=31_536_000,
        description="The least time between two learning runs' triggers (default one day).",
    )


class Training(Model):
    """How a learning run trains: upgradePolicy.trainTemplate's job on a snapshot of the captured shards."""

    captured_share: float = Field(
        default=0.5,
        ge=0.01,
        le=1,
        description="The share of training rows taken from captured data, 0.01..1; the rest come from the "
        "template's data (1: captured data only).",
        json_schema_extra=at_least(0.01, "training.capturedShare"),
    )
    held_out: float = Field(
        default=0.1,
        ge=0.01,
        le=0.5,
        description="The share of the snapshot held out for the job's evaluation, 0.01..0.5.",
        json_schema_extra=at_least(0.01, "training.heldOut"),
    )


class Learning(Model):
    """Capture the verifier's own served completions, retrain the draft on them when the trigger holds, and let
    the canary decide (docs/concepts/learning.md). Off unless this block is set."""

    capture: Capture = Field(
        default_factory=Capture,
        description="Which served requests are captured. Picked up live: a change of this block reaches the "
        "running serving pods without a restart.",
        json_schema_extra={"default": {}},
    )
    storage: Storage = Field(
        description="Where captured samples go and how long they stay. A change of the location or the "
        "credentials, or turning learning on or off, rolls the serving pods."
    )
    trigger: Trigger = Field(
        default_factory=Trigger,
        description="When a learning run starts.",
        json_schema_extra={"default": {}},
    )
    training: Training = Field(
        default_factory=Training,
        description="How the captured data meets the template's data in a learning run.",
        json_schema_extra={"default": {}},
    )


class LearningBaseline(Model):
    """The served draft's own live acceptance on this traffic, from its first counted windows."""

    value: float = Field(description="The drafts-weighted mean of the counted windows' figure.")
    metric: Literal["Alpha"] = Field(default="Alpha", description="The figure: Alpha (per-position acceptance).")
    draft_revision: str = Field(description="The draft revision it belongs to: a new one starts a new baseline.")
    windows: int = Field(description="Windows counted into it so far (up to trigger.drift.baselineWindows).")
    drafts: int = Field(default=0, description="Drafts behind the value (the weights of its mean).")
    since: str = Field(description="RFC 3339 end of the first window counted into it.")
    complete: bool = Field(
        default=False, description="True once baselineWindows windows are counted: drift is judged from then on."
    )


class LearningTrigger(Model):
    """A trigger that fired."""

    at: str = Field(description="RFC 3339 time it fired.")
    reason: LearningReason = Field(
        description="Drift (live acceptance below its baseline, with enough new samples), Samples (enough new "
        "samples, no drift configured) or Requested (asked for by hand)."
    )
    message: str = Field(default="", description="Why, with the figures.")


class LearningRun(Model):
    """A learning run: the SpeculatorTrainJob a trigger started, and what became of its draft."""

    name: str = Field(description="The SpeculatorTrainJob.")
    snapshot: str | None = Field(default=None, description="The location of the shard list it trains on.")
    samples: int | None = Field(default=None, description="Captured samples in its snapshot.")
    state: RunState = Field(description="Running, Succeeded or Failed: the train job's outcome.")
    verdict: Literal["Promoted", "RolledBack"] | None = Field(
        default=None, description="Its draft's canary verdict, once given."
    )
    started_at: str | None = Field(default=None, description="RFC 3339 time the run started.")
    finished_at: str | None = Field(default=None, description="RFC 3339 time the train job ended.")


class LearningStatus(Model):
    """What learning captured, the baseline and the trigger's state (written by the operator only)."""

    verifier_revision: str | None = Field(
        default=None, description="The verifier revision samplesSinceRun and the baseline belong to."
    )
    captured: int | None = Field(default=None, description="Samples the serving pods captured, in all.")
    skipped: int | None = Field(
        default=None, description="Sampled requests not captured: not on-policy (a LoRA adapter, beam search, ...)."
    )
    dropped: int | None = Field(
        default=None, description="Captured samples dropped before storage: the pod's spool was full."
    )
    bytes: int | None = Field(default=None, description="Bytes the serving pods wrote to storage, in all.")
    samples_since_run: int | None = Field(
        default=None,
        description="Captured samples of the current verifier revision since the last learning run's snapshot.",
    )
    counted_until: str | None = Field(
        default=None, description="The end of the last window counted: no window ending at or before it counts again."
    )
    baseline: LearningBaseline | None = Field(
        default=None, description="The live baseline drift is judged against (with trigger.drift)."
    )
    below_windows: int | None = Field(
        default=None, description="Consecutive counted windows below baseline - margin (with trigger.drift)."
    )
    last_trigger: LearningTrigger | None = Field(default=None, description="The last trigger that fired, and why.")
    job: LearningRun | None = Field(default=None, description="The running or last learning run.")
    rejected_at_samples: int | None = Field(
        default=None,
        description="`captured` when the last learned draft was rolled back: no trigger until minNewSamples more "
        "are captured.",
    )
    next_trigger_at: str | None = Field(
        default=None, description="RFC 3339: the earliest a trigger may fire (the cooldown); unset before the first."
    )
    blocked: str | None = Field(
        default=None,
        description="Why no trigger may fire now, in words: a learning run in flight, a retraining, a verifier "
        "change, a canary, the cooldown, a rolled-back learned draft. Unset when none holds.",
    )
