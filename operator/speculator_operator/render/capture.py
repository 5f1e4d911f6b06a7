"""What `spec.learning` adds to a serving pod: the capture as vLLM middleware, its settings, its storage
(docs/concepts/learning.md#capture-in-the-pod). Pure.

The settings come in two parts. What is fixed for a pod's life (the pair it serves, K, its server's own flags,
where shards go) is JSON in the pod template, so each ReplicaSet's pods label their shards with their own pair
while a canary or a rollout runs beside them. What may change live (the sampling, the cap's share, the
redactions, whether capture is on at all) is a ConfigMap the pods read without a restart; one per deployment,
shared by the incumbent and its canary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.learning import Learning
from speculator_operator.api.podcontract import (
    CAPTURE_CONFIG_ENV,
    CAPTURE_CREDENTIALS_ENV,
    CAPTURE_CREDENTIALS_MOUNT,
    CAPTURE_MIDDLEWARE,
    CAPTURE_POD_ENV,
    CAPTURE_POD_SETTINGS_ENV,
    CAPTURE_PVC_MOUNT,
    CaptureSettings,
)
from speculator_operator.domain.location import Location

CONFIG_MOUNT = "/etc/speculator/capture"  # a directory mount: the kubelet updates it in place (a subPath it never does)
CONFIG_KEY = "settings.json"
CONFIG_SUFFIX = "-capture"
# vLLM's per-request acceptance (0.32 and later), which the capture keeps with each row
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"
# a render note's reasons (status.renderNotes, the Serving condition's message) while the capture cannot write
CAPTURE_CLAIM_MISSING = "CaptureClaimMissing"
CAPTURE_CREDENTIALS_UNREADABLE = "CaptureCredentialsUnreadable"


def per_pod_budget(max_per_hour: int, replicas: int, processes: int = 1) -> int:
    """Captures per hour for each capture in `replicas` pods of `processes` vLLM API-server processes each (vLLM
    builds one middleware per process, each counting on its own): floor(maxPerHour / (replicas × processes)), so
    that they together never exceed the deployment's cap. 0 when the cap is below their count (they capture
    nothing), and with none."""
    if replicas <= 0 or processes <= 0:
        return 0
    return max_per_hour // (replicas * processes)


def config_map_name(name: str) -> str:
    return f"{name}{CONFIG_SUFFIX}"


def _flag(args: list[str], flag: str) -> str | None:
    """The value given to `flag` in `args` (`--flag v` or `--flag=v`; the last wins, as argparse has it), "" for a
    bare switch, None when absent."""
    found: str | None = None
    for i, arg in enumerate(args):
        if arg == flag:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            found = "" if nxt.startswith("--") else nxt
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    return found


@dataclass(frozen=True)
class ServerFlags:
    """What the user's own extraArgs tell the capture: what their clients asked for stays in the responses."""

    keep_metrics: bool  # the user renders --per-request-spec-decode-metrics: the field is theirs
    timing_metrics: bool  # --enable-per-request-metrics: `metrics` stays, less its speculative_decoding
    force_include_usage: bool  # every stream carries usage already
    processes: int  # vLLM API-server processes, each with its own capture


def server_flags(spec: SpeculatorDeploymentSpec) -> ServerFlags:
    extra = list(spec.serving.extra_args)
    per_request = _flag(extra, PER_REQUEST_FLAG)
    count = _flag(extra, "--api-server-count")
    # unset, vLLM may run one API server per data-parallel rank: dividing by that never exceeds the cap
    processes = int(count) if count and count.isdigit() and int(count) > 0 else max(1, spec.serving.layout.data)
    return ServerFlags(
        keep_metrics=per_request not in (None, "", "none"),
        timing_metrics=_flag(extra, "--enable-per-request-metrics") is not None,
        force_include_usage=_flag(extra, "--enable-force-include-usage") is not None,
        processes=processes,
    )


def server_args(spec: SpeculatorDeploymentSpec, speculating: bool) -> list[str]:
    """The vLLM flags the capture needs: the middleware, and each request's acceptance where there is speculation
    (K = 0 renders no speculative config, and vLLM refuses the flag without one)."""
    args = ["--middleware", CAPTURE_MIDDLEWARE]
    if speculating and not server_flags(spec).keep_metrics:
        args += [PER_REQUEST_FLAG, "summary"]
    return args


def capturing_pods(spec: SpeculatorDeploymentSpec) -> int:
    """The most serving pods that capture at once: the replicas, and a Surge canary's beside them (an InPlace
    canary takes its pods from the replicas)."""
    replicas = spec.serving.replicas
    canary = spec.upgrade_policy.canary
    if canary is not None and canary.mode != "InPlace":
        return replicas + canary.canary_replicas(replicas)
    return replicas


def live_settings(spec: SpeculatorDeploymentSpec, learning: Learning, enabled: bool) -> dict[str, Any]:
    """The ConfigMap's part: what a change of spec.learning.capture (or of the replicas) changes in running pods."""
    capture = learning.capture
    share = per_pod_budget(capture.max_per_hour, capturing_pods(spec), server_flags(spec).processes)
    out: dict[str, Any] = {
        "enabled": enabled,
        "fraction": capture.fraction,
        "mode": capture.mode,
        "maxPerHour": share,
        "redact": [{"pattern": r.pattern} for r in capture.redact or []],
        "retentionDays": learning.storage.retention_days,  # the pods delete older shards (pods/capture/retention.py)
    }
    if capture.effective_threshold is not None:
        out["threshold"] = capture.effective_threshold
    return out


@dataclass(frozen=True)
class Pair:
    """What a pod template serves: its revision, the pair's revisions, K."""

    revision: str
    verifier_revision: str
    draft_revision: str
    k: int
    served_model: str


def pod_settings(namespace: str, name: str, spec: SpeculatorDeploymentSpec, pair: Pair) -> dict[str, Any]:
    """The template's part: fixed for the pod's life."""
    learning = spec.learning
    assert learning is not None
    flags = server_flags(spec)
    return {
        "location": learning.storage.location,
        "namespace": namespace,
        "deployment": name,
        # vLLM answers with the first of the names; the user's own in extraArgs wins over the operator's
        "servedModel": _flag(list(spec.serving.extra_args), "--served-model-name") or pair.served_model,
        "servedRevision": pair.revision,
        "verifierRevision": pair.verifier_revision,
        "draftRevision": pair.draft_revision,
        "k": pair.k,
        "keepMetrics": flags.keep_metrics,
        "timingMetrics": flags.timing_metrics,
        "forceIncludeUsage": flags.force_include_usage,
    }


def config_map(
    namespace: str, name: str, spec: SpeculatorDeploymentSpec, enabled: bool, meta: dict[str, Any]
) -> dict[str, Any]:
    """The deployment's capture ConfigMap (`meta`: its labels and owner, as the other children have them)."""
    learning = spec.learning
    assert learning is not None
    body = json.dumps(live_settings(spec, learning, enabled), separators=(",", ":"), sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": config_map_name(name), "namespace": namespace},
        "data": {CONFIG_KEY: body},
    }


def template_key(learning: Learning, claim: bool) -> list[Any]:
    """What of spec.learning is in the pod template beyond vLLM's flags: part of the revision, since a change of it
    rolls the pods (the capture block is not: it is live)."""
    credentials = learning.storage.credentials
    return [learning.storage.location, credentials.name if credentials else None, claim]


@dataclass
class PodParts:
    """What the capture adds to the serving container and its pod."""

    env: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]


def pod_parts(namespace: str, name: str, spec: SpeculatorDeploymentSpec, pair: Pair, claim: bool = True) -> PodParts:
    """`claim`: a pvc:// location's claim exists (without it the pod mounts none: it could not start)."""
    learning = spec.learning
    assert learning is not None
    settings = pod_settings(namespace, name, spec, pair)
    # what the pod reads is what the operator means: a settings file and this together make valid CaptureSettings
    CaptureSettings.model_validate({**live_settings(spec, learning, True), **settings})
    env: list[dict[str, Any]] = [
        {"name": CAPTURE_CONFIG_ENV, "value": f"{CONFIG_MOUNT}/{CONFIG_KEY}"},
        {"name": CAPTURE_POD_SETTINGS_ENV, "value": json.dumps(settings, separators=(",", ":"), sort_keys=True)},
        {"name": CAPTURE_POD_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    volumes: list[dict[str, Any]] = [
        # optional: the pod starts, and serves, before the operator's first write of it (the capture is off then)
        {"name": "capture-settings", "configMap": {"name": config_map_name(name), "optional": True}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "capture-settings", "mountPath": CONFIG_MOUNT, "readOnly": True}]
    where = Location.parse(learning.storage.location)
    if where.is_pvc and claim:
        volumes.append({"name": "capture-storage", "persistentVolumeClaim": {"claimName": where.root}})
        mounts.append({"name": "capture-storage", "mountPath": CAPTURE_PVC_MOUNT})
    credentials = learning.storage.credentials
    if where.is_s3 and credentials is not None:
        # files, not environment: the serving container's own AWS_* (its model's credentials) stay its own, a
        # rotated Secret reaches the running pod, and a missing one leaves the pod serving (optional)
        volumes.append({"name": "capture-credentials", "secret": {"secretName": credentials.name, "optional": True}})
        mounts.append({"name": "capture-credentials", "mountPath": CAPTURE_CREDENTIALS_MOUNT, "readOnly": True})
        env.append({"name": CAPTURE_CREDENTIALS_ENV, "value": CAPTURE_CREDENTIALS_MOUNT})
    return PodParts(env, volumes, mounts)
