"""The contract between the pods the operator renders and the operator that reads what they leave.

Both sides import this module and nothing else of each other (docs/design/pod-contract.md):
- the stage report: one JSON object a stage's entrypoint leaves as its container's termination message,
  which the operator reads from the pod's status (`StageReport`);
- the server's exit record: what a vLLM server container's entrypoint leaves as its termination message when
  vLLM exits with a failure, with a reason the operator shows (`ServerExit`);
- the exit codes of the in-pod commands (`ExitCode`) and the evaluate stage's outcomes (`EvaluationOutcome`),
  which the rendered Jobs' podFailurePolicy and the train job's conditions name;
- the progress line a running stage prints to its log and the operator reads from the log's tail;
- the environment variables of the contract, each with its one default;
- the capture in the serving pod: its settings file (`CaptureSettings`), its shard schema version and the names
  of the counters the operator reads from the pod's /metrics.
"""

from __future__ import annotations

import json
import math
import os
from enum import IntEnum, StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from speculator_operator.api.learning import DEFAULT_THRESHOLD

# ---- environment ------------------------------------------------------------------------------------------

REPORT_PATH_ENV = "SPECULATOR_REPORT_PATH"  # where a stage writes its report (tests point it at a file)
REPORT_PATH_DEFAULT = "/dev/termination-log"  # the kubelet's terminationMessagePath default
PROGRESS_SECONDS_ENV = "SPECULATOR_PROGRESS_SECONDS"  # how often a stage prints its line and the operator reads it
PROGRESS_SECONDS_DEFAULT = 10.0


def report_path() -> str:
    return os.environ.get(REPORT_PATH_ENV, REPORT_PATH_DEFAULT)


def progress_seconds() -> float:
    return float(os.environ.get(PROGRESS_SECONDS_ENV, str(PROGRESS_SECONDS_DEFAULT)))


# ---- exit codes and outcomes ------------------------------------------------------------------------------


class ExitCode(IntEnum):
    """What an in-pod command's exit status means (the CLI's own: 0, 1, 2; the evaluate stage's: 3-5)."""

    OK = 0
    PROBLEM = 1  # it ran and found a problem (audit errors, a failed copy); a Job may retry it
    USAGE = 2  # bad usage or unreadable input: retrying cannot help
    BELOW_THRESHOLD = 3  # evaluate: acceptance or predicted speedup below the spec's bound
    ZERO_DRAFTS = 4  # evaluate: vLLM made no drafts (it served without speculation)
    SERVER_NOT_READY = 5  # evaluate: the evaluation server was not ready within the stage's timeout
    SWEEP_FAILED = 6  # sweep: a point could not be measured (a server gone, a refused request, the timeout)


class EvaluationOutcome(StrEnum):
    """The evaluate stage's verdict: the report's `evaluation.outcome`, and the reason of the train job's
    condition when it fails the run."""

    PASSED = "Passed"
    BELOW_THRESHOLD = "AcceptanceBelowThreshold"
    ZERO_DRAFTS = "ZeroDrafts"
    SERVER_NOT_READY = "EvaluationServerNotReady"

    @property
    def exit_code(self) -> ExitCode:
        return _EXIT_OF[self]


_EXIT_OF = {
    EvaluationOutcome.PASSED: ExitCode.OK,
    EvaluationOutcome.BELOW_THRESHOLD: ExitCode.BELOW_THRESHOLD,
    EvaluationOutcome.ZERO_DRAFTS: ExitCode.ZERO_DRAFTS,
    EvaluationOutcome.SERVER_NOT_READY: ExitCode.SERVER_NOT_READY,
}
FAILED_EVALUATIONS = tuple(o for o in EvaluationOutcome if o is not EvaluationOutcome.PASSED)


# ---- the stage report -------------------------------------------------------------------------------------

REPORT_VERSION = 1
REPORT_LIMIT = 4096  # the kubelet keeps at most 4 KiB of a termination message


def _marked(message: str | None, marker: str) -> dict[str, Any] | None:
    """The JSON object in a termination message that carries `marker` (None for a log tail, garbage, another record)."""
    if not message:
        return None
    try:
        value = json.loads(message)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get(marker) else None


class StageReport(BaseModel):
    """What a finished stage reports. Every field but the marker is optional: each stage fills its own."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    speculators_report: int = Field(REPORT_VERSION, alias="speculatorsReport")
    stage: str | None = None
    seconds: float | None = None  # the tool's run time
    samples: int | None = None  # prepare, regenerate, extract: rows or files written
    held_out: int | None = Field(None, alias="heldOut")  # prepare: samples split off for evaluate
    fingerprint: str | None = None  # prepare: the dataset's fingerprint
    epoch: int | None = None  # train: epochs saved
    checkpoint: str | None = None  # convert, stitch, audit: the folder
    files: int | None = None  # convert, stitch: files written
    verifier: str | None = None  # fetch: where the verifier was staged
    revision: str | None = None  # fetch: the verifier revision fetched
    data_files: int | None = Field(None, alias="dataFiles")  # fetch: data files staged
    converted: str | None = None  # fetch: the staged source of a conversion
    algorithm: str | None = None  # audit: the checkpoint's speculators_model_type
    audit: dict[str, Any] | None = None  # audit: the summary (ok, counts, findings)
    uri: str | None = None  # publish: the exact location written
    digest: str | None = None  # publish: the content digest
    evaluation: dict[str, Any] | None = None  # evaluate: what was measured, with `outcome`
    message: str | None = None  # evaluate: the verdict in words
    sweep: dict[str, Any] | None = None  # sweep: {label, k, device, points} of one server lifetime, or {failedAt}

    def encode(self) -> str:
        """The termination message: compact JSON within REPORT_LIMIT (the audit's findings are cut first)."""
        body = self.model_dump(by_alias=True, exclude_none=True)
        text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        while len(text.encode()) > REPORT_LIMIT and (body.get("audit") or {}).get("findings"):
            body["audit"]["findings"] = body["audit"]["findings"][:-1]
            text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        return text

    @classmethod
    def decode(cls, message: str | None) -> StageReport | None:
        """The report in a termination message (None when the message is not one: a log tail, garbage)."""
        value = _marked(message, "speculatorsReport")
        try:
            return None if value is None else cls.model_validate(value)
        except ValidationError:
            return None

    def merged(self, newer: StageReport) -> StageReport:
        """This report with what a newer pod of the same stage reported over it (an Indexed Job's ranks)."""
        fields = {
            **self.model_dump(by_alias=True, exclude_none=True),
            **newer.model_dump(by_alias=True, exclude_none=True),
        }
        return StageReport.model_validate(fields)


# ---- the server's exit record ------------------------------------------------------------------------------

SERVER_EXIT_VERSION = 1
SERVER_EXIT_TAIL = 3000  # bytes of the server's last output kept in the record (the whole stays within REPORT_LIMIT)


class ServerExitReason(StrEnum):
    """Why a vLLM server container stopped: the reason of the Serving condition (a deployment) or of the stage's
    message (a train job's server) the operator shows for it."""

    NO_ACCELERATOR = "NoAccelerator"  # vLLM exited and its own platform detection finds no device it can run on
    ENGINE_EXITED = "EngineExited"  # vLLM exited with a failure on a platform it could use (its log's tail says why)
    DRAFT_AUDIT_FAILED = "DraftAuditFailed"  # the entrypoint's audit refused the staged draft: vLLM never started


class ServerExit(BaseModel):
    """The termination message of a server container whose vLLM failed (pods/supervise.py writes it)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    speculators_server: int = Field(default=SERVER_EXIT_VERSION, alias="speculatorsServer")
    reason: ServerExitReason
    exit_code: int = Field(alias="exitCode")  # vLLM's exit status (128 + N for a signal N)
    platform: str | None = None  # vLLM's platform device type as it resolves it in the pod ("" for none)
    message: str = ""  # what happened in words, then the tail of the server's output

    def encode(self) -> str:
        """Compact JSON within REPORT_LIMIT bytes: the message loses its oldest characters first (the fewest that
        make it fit), so the end of the server's output, where its error is, stays."""
        body = self.model_dump(by_alias=True, exclude_none=True)

        def dumped(message: str) -> str:
            return json.dumps({**body, "message": message}, separators=(",", ":"), sort_keys=True, ensure_ascii=False)

        message = body["message"]
        if len(dumped(message).encode()) <= REPORT_LIMIT:
            return dumped(message)
        lo, hi = 1, len(message)  # the first kept character: the smallest cut that fits
        while lo < hi:
            mid = (lo + hi) // 2
            if len(dumped("…" + message[mid:]).encode()) <= REPORT_LIMIT:
                hi = mid
            else:
                lo = mid + 1
        return dumped("…" + message[lo:])

    @classmethod
    def decode(cls, message: str | None) -> ServerExit | None:
        """The record in a termination message (None when the message is not one: a log tail, a stage report)."""
        value = _marked(message, "speculatorsServer")
        try:
            return None if value is None else cls.model_validate(value)
        except ValidationError:
            return None


# ---- the progress line ------------------------------------------------------------------------------------

PROGRESS_PREFIX = "speculators-progress "
PROGRESS_MAX_LINE = 4096  # a progress line longer than this is not one of ours
PROGRESS_MAX_METRICS = 16
PROGRESS_INTS = ("samples", "samplesTarget", "step", "epoch", "epochs", "epochsCompleted", "etaSeconds")
PROGRESS_FIELDS = frozenset({*PROGRESS_INTS, "stage", "loss", "metrics"})
_LIMIT = 10**12


def progress_line(fields: dict[str, Any]) -> str:
    """One progress line: the prefix, then the fields as compact JSON (None values left out)."""
    body = {k: v for k, v in fields.items() if v is not None}
    return PROGRESS_PREFIX + json.dumps(body, separators=(",", ":"), sort_keys=True)


def parse_progress(text: str, stage: str) -> dict[str, Any] | None:
    """The last trustworthy progress line of `stage` in a log tail (None: there is none). Garbage, in part or
    whole, is dropped: an unknown key, a value of the wrong type or out of range, another stage's line."""
    for raw in reversed(text.splitlines()):
        at = raw.find(PROGRESS_PREFIX)
        if at < 0 or len(raw) - at > PROGRESS_MAX_LINE:
            continue
        try:
            found = json.loads(raw[at + len(PROGRESS_PREFIX) :])
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("stage") == stage:
            return _clean(found)
    return None


def _clean(found: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in PROGRESS_INTS:
        value = found.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _LIMIT:
            out[key] = value
    loss = found.get("loss")
    if isinstance(loss, int | float) and not isinstance(loss, bool) and math.isfinite(loss):
        out["loss"] = float(loss)
    metrics = found.get("metrics")
    if isinstance(metrics, dict):
        kept = {
            str(k)[:64]: float(v)
            for k, v in list(metrics.items())[:PROGRESS_MAX_METRICS]
            if isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if kept:
            out["metrics"] = kept
    return out


# ---- the capture in the serving pod -----------------------------------------------------------------------
# pods/capture/ runs inside vLLM's API server (`--middleware CAPTURE_MIDDLEWARE`); the operator writes its
# settings into a ConfigMap mounted at the file CAPTURE_CONFIG_ENV names, and reads its counters from the /metrics
# vLLM serves (docs/concepts/learning.md#capture-in-the-pod).

CAPTURE_CONFIG_ENV = "SPECULATOR_CAPTURE_CONFIG"  # the path of the CaptureSettings JSON file in the serving pod
# what is fixed for a pod's life (its pair, its server's flags, where shards go), as CaptureSettings JSON in the pod
# template; the file holds what may change live, and a key in both is the template's
CAPTURE_POD_SETTINGS_ENV = "SPECULATOR_CAPTURE_POD"
CAPTURE_CREDENTIALS_ENV = "SPECULATOR_CAPTURE_CREDENTIALS"  # a directory of AWS_* files (storage.credentials)
CAPTURE_CREDENTIALS_MOUNT = "/var/run/secrets/speculator/capture"
CAPTURE_MIDDLEWARE = "speculator_operator.pods.capture.middleware.Capture"  # what vLLM's --middleware names
CAPTURE_PVC_MOUNT = "/var/lib/speculator/capture"  # where a pvc:// location's claim is mounted in the serving pod
# the pod's name (the downward API), part of every shard's key; else $HOSTNAME. Prefixed: a user's own POD_NAME in
# serving.env would otherwise be a duplicate key, which server-side apply refuses
CAPTURE_POD_ENV = "SPECULATOR_CAPTURE_POD_NAME"
CAPTURE_SHARD_VERSION = 1  # the `schemaVersion` of every shard row

# the counters, as /metrics exposes them (prometheus_client's default registry in vLLM's API server process)
CAPTURE_REQUESTS_METRIC = "speculator_capture_requests_total"  # {outcome}: one per sampled request, once settled
CAPTURE_SKIPPED_METRIC = "speculator_capture_skipped_total"  # {reason}: sampled requests not captured, by reason
CAPTURE_BYTES_METRIC = "speculator_capture_bytes_total"  # shard bytes written to storage
CAPTURE_SPOOL_ROWS_METRIC = "speculator_capture_spool_rows"  # rows waiting in the pod's spool (a gauge)
CAPTURE_ERRORS_METRIC = "speculator_capture_errors_total"  # {kind}: config, capture, storage, retention
CAPTURE_EXPIRED_METRIC = "speculator_capture_expired_total"  # shards deleted past storage.retentionDays
CAPTURE_OUTCOMES = ("captured", "skipped", "dropped")


class CaptureRedaction(BaseModel):
    """One of spec.learning.capture.redact, as the pod compiles it."""

    model_config = ConfigDict(extra="ignore")

    pattern: str


class CaptureSettings(BaseModel):
    """What the capture in a serving pod does: spec.learning.capture with what the operator computed for the pod
    (its share of the hourly cap), where shards go and what they are labelled with. The operator writes it as
    camelCase JSON; unknown keys are ignored, so a pod reads a newer operator's file during a rollout."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    enabled: bool = True  # False: capture nothing (a missing or unreadable Secret), keep serving and stripping
    fraction: float = Field(ge=0, le=1)
    mode: Literal["All", "BelowThreshold"] = "All"
    threshold: float | None = Field(default=None, ge=0, le=1)  # BelowThreshold: keep acceptance below it
    max_per_hour: int = Field(ge=0)  # this pod's share: floor(maxPerHour / R)
    redact: list[CaptureRedaction] = Field(default_factory=list)
    location: str = Field(pattern=r"^(s3|pvc)://[^/]+/.+$")  # spec.learning.storage.location
    pvc_mount: str = CAPTURE_PVC_MOUNT  # where a pvc:// location's claim is mounted
    namespace: str = Field(min_length=1)
    deployment: str = Field(min_length=1)
    served_model: str = Field(min_length=1)  # vLLM's first served model name: a response naming another is a LoRA
    served_revision: str = ""  # status.revision of the serving pods
    verifier_revision: str = Field(min_length=1)
    draft_revision: str = Field(min_length=1)
    k: int = Field(ge=0)
    # the user's own server flags: what the client asked for is not stripped
    keep_metrics: bool = False  # --per-request-spec-decode-metrics is the user's: metrics reach the client as is
    timing_metrics: bool = False  # --enable-per-request-metrics: only metrics.speculative_decoding is removed
    force_include_usage: bool = False  # --enable-force-include-usage: every stream carries usage already
    retention_days: int | None = Field(default=None, ge=1)  # storage.retentionDays: older shards are deleted
    # when a shard is written (unset: the pod's defaults, pods/capture/spool.py SHARD_ROWS and SHARD_SECONDS)
    shard_rows: int | None = Field(default=None, ge=1)
    shard_seconds: float | None = Field(default=None, gt=0)

    @property
    def effective_threshold(self) -> float:
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold
