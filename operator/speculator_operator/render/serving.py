"""Pure builders of a SpeculatorDeployment's children: the vLLM command line for the pinned release,
the Deployment, the Service and the PodDisruptionBudget.

Facts (docs/reference/vllm.md): the long form with an explicit `method` is the only safe form
(path heuristics otherwise pick `draft_model`); `num_speculative_tokens` must be given; P-EAGLE is
eagle3 + parallel_drafting; the DFlash family serves as dflash; the load cut-off is
`num_speculative_tokens_per_batch_size` from vLLM 0.24 and `disable_by_batch_size` must never be
emitted (removed in 0.17, fatal at start-up since); a Service named `vllm` injects VLLM_PORT and
breaks start-up; SIGTERM drains for --shutdown-timeout seconds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from speculator_operator.api.common import API_VERSION
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.labels import (
    DEPLOYMENT_LABEL,
    DRAFT_ANNOTATION,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    REVISION_LABEL,
    ROLE_LABEL,
)
from speculator_operator.domain.algorithms import MTP_METHOD, SERVED_AS_DRAFT, Algorithm
from speculator_operator.domain.checkpoint.manifest import Kind, Manifest
from speculator_operator.domain.checkpoint.model import Checkpoint
from speculator_operator.domain.economics import schedule_from_cutoff
from speculator_operator.domain.location import Location, Scheme
from speculator_operator.domain.parallelism import Layout
from speculator_operator.domain.releases import VLLM_FEATURES, Release, Version, pinned, supports
from speculator_operator.render import capture, group

PORT = 8000
DRAFT_DIR = "/models/draft"
VERIFIER_DIR = "/models/verifier"
SHM_SIZE = "16Gi"
SHM = "/dev/shm"  # noqa: S108 - a memory-backed volume for NCCL and the data loaders, not a temp file
GPU = "nvidia.com/gpu"
MANAGED_BY = "speculator-operator"
USER_ID = 65532  # the images' non-root user (operator_image/, server_image/, trainer_image/)
# what the Pod Security Standard `restricted` asks of a pod and of each of its containers
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": USER_ID,
    "runAsGroup": USER_ID,
    "fsGroup": USER_ID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

METHOD = SERVED_AS_DRAFT  # speculators_model_type -> vLLM method (the algorithm table)


class RenderError(ValueError):
    """The spec cannot be served as asked; the message says why, `reason` is the condition's reason."""

    def __init__(self, message: str, reason: str = "InvalidSpec") -> None:
        super().__init__(message)
        self.reason = reason


LAYOUT_UNSUPPORTED = "LayoutUnsupported"  # a parallel layout the release cannot serve (planning.inputs.ServingReason)
GROUP_SUFFIX = "-group"  # a LeaderWorkerSet's name: its owner's, with this (workload_name)
ADAPTIVE = "AdaptiveVerification"  # vLLM decides per step: the schedule and K tuning stand down
SCHEDULE_OFF = "ScheduleOff"  # data parallelism > 1: vLLM serves a static K (docs/reference/parallelism.md)


@dataclass(frozen=True)
class Draft:
    """What the audit learned about the draft checkpoint."""

    algorithm: str
    speculative_tokens: int
    revision: str | None = None
    manifest: Manifest | None = None  # the audited files: the only ones the pod may stage
    stitched: bool = False  # an MTP head stitched into the verifier: served as the target (method mtp)


@dataclass(frozen=True)
class Tuned:
    """What tuning (planning/tuning.py) serves instead of the spec's K: K (0: no speculation) and the
    per-batch-size schedule."""

    k: int
    schedule: tuple[tuple[int, int, int], ...] | None = None
    source: str = "tuning"  # or "sweep": the draft's measured sweep (planning/measured.py)


@dataclass(frozen=True)
class CaptureOff:
    """Why the capture cannot write (a condition's reason and message); `claim`: the pvc:// claim is missing."""

    reason: str
    message: str
    claim: bool = False


@dataclass(frozen=True)
class Inputs:
    name: str
    namespace: str
    spec: SpeculatorDeploymentSpec
    release: Release
    draft: Draft
    verifier_revision: str | None = None
    owner_uid: str | None = None
    draft_source: str | None = None  # the exact location read (a train job's output, a pointer's target)
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads
    verifier_manifest: Manifest | None = None  # an s3 verifier's audited files
    tuned: Tuned | None = None  # Auto's K and schedule, where the spec leaves K to the operator
    # spec.learning's storage as the pass found it: None when it can be written to, else why the capture is off
    # (a missing credentials Secret: the pods still mount it, optionally; a missing claim: they do not, or they
    # could not start)
    capture_off: CaptureOff | None = None
    keep_revision: str | None = None  # an earlier operator's name for this same pair (planning/adoption.py)
    pull_secrets: tuple[str, ...] = ()  # imagePullSecrets of every pod (the operator's settings)


@dataclass
class Rendered:
    children: list[dict[str, Any]]
    vllm_args: list[str]
    speculative_config: dict[str, Any] | None  # None: tuned off (no speculation)
    revision: str
    notes: list[tuple[str, str]] = field(default_factory=list)  # (reason, message) for conditions


def num_speculative_tokens(spec: SpeculatorDeploymentSpec, draft: Draft, tuned: Tuned | None = None) -> int:
    """K as served: the spec's, else what Auto tuned (0: speculation off), else the checkpoint's."""
    k = spec.serving.num_speculative_tokens
    if k != "auto":
        return int(k)
    return tuned.k if tuned is not None else draft.speculative_tokens


def draft_of(ck: Checkpoint) -> Draft:
    """What serving needs of an audited checkpoint: an MTP head stitched into its verifier is served as the
    target (method mtp, K defaulting to its layer count), any other draft beside it."""
    if ck.stitched_mtp and ck.mtp_layers is not None:
        return Draft(Algorithm.MTP.value, ck.mtp_layers, ck.revision, ck.manifest, stitched=True)
    if ck.algorithm is None or ck.speculative_tokens is None:
        raise RenderError("the checkpoint has no algorithm or speculative_tokens")
    return Draft(ck.algorithm, ck.speculative_tokens, ck.revision, ck.manifest)


def draft_config(draft: Draft, vllm: Version, k: int, draft_path: str) -> dict[str, Any]:
    """The long-form --speculative-config's method, model and K for `draft` in vLLM `vllm` (K > 0)."""
    algo = draft.algorithm
    if algo == Algorithm.MTP and not draft.stitched:
        raise RenderError("an mtp checkpoint is not a loadable draft: stitch it into the verifier (stitch-mtp)")
    if algo not in METHOD and not draft.stitched:
        raise RenderError(f"vLLM {vllm} has no drafter for {algo!r}")
    if draft.stitched:
        # vLLM reuses the n_predict MTP layers in turn: a K above it must be a multiple (docs/reference/vllm.md §1.4)
        layers = draft.speculative_tokens
        if k > layers and k % layers:
            raise RenderError(f"numSpeculativeTokens {k} is above the model's {layers} MTP layer(s) and not a "
                              f"multiple of it: vLLM refuses it")  # fmt: skip
        config: dict[str, Any] = {"method": MTP_METHOD, "num_speculative_tokens": k}
    else:
        config = {"method": METHOD[algo], "model": draft_path, "num_speculative_tokens": k}
    if algo == Algorithm.PEAGLE:
        refusal = VLLM_FEATURES["parallel_drafting"].why_not(vllm, "P-EAGLE's parallel_drafting")
        if refusal:
            raise RenderError(refusal)
        config["parallel_drafting"] = True
    return config


def speculative_config(inputs: Inputs, draft_path: str) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The long-form --speculative-config for the pinned vLLM (None where tuning switched speculation off),
    and notes for conditions."""
    vllm = inputs.release.vllm_version
    k = num_speculative_tokens(inputs.spec, inputs.draft, inputs.tuned)
    if k == 0:
        draft_config(inputs.draft, vllm, 1, draft_path)  # an unservable draft is refused even when tuned off
        if inputs.tuned is not None and inputs.tuned.source == "sweep":
            said = ("the draft's measured sweep found plain decoding at least as fast at every concurrency on this "
                    "device class; set numSpeculativeTokens to speculate anyway")  # fmt: skip
            return None, [("SpeculationOff", said)]
        return None, [("SpeculationOff", "tuning switched speculation off; a probe revision measures it again")]
    config = draft_config(inputs.draft, vllm, k, draft_path)
    notes: list[tuple[str, str]] = []
    if inputs.spec.serving.adaptive_verification:
        config["enable_adaptive_verification"] = True
        adaptive_refusal(inputs)
        notes.append((ADAPTIVE, f"vLLM {vllm} trims verification per step (adaptive verification): no per-batch-size "
                      f"schedule is rendered and K stays {k}"))  # fmt: skip
        return config, notes
    cutoff = inputs.spec.serving.cutoff
    tuned_schedule = inputs.tuned.schedule if inputs.tuned is not None and cutoff is None else None
    data = inputs.spec.serving.layout.data
    if data > 1 and not inputs.release.parallel.schedule_under_data_parallel and (cutoff or tuned_schedule):
        # vLLM drops the schedule with a warning (DP ranks could pick different K and deadlock): say so, render none
        said = (f"data parallelism {data}: vLLM {vllm} ignores num_speculative_tokens_per_batch_size under data "
                f"parallelism and serves K={k} at every batch size; no schedule is rendered")  # fmt: skip
        notes.append((SCHEDULE_OFF, said))
        return config, notes
    if tuned_schedule and supports(vllm, "num_speculative_tokens_per_batch_size"):
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in tuned_schedule]
    elif cutoff is not None:
        if supports(vllm, "num_speculative_tokens_per_batch_size"):
            schedule = schedule_from_cutoff(k, cutoff.max_batch_size, inputs.spec.serving.max_num_seqs)
            config["num_speculative_tokens_per_batch_size"] = schedule.as_list()
        else:
            notes.append(("CutoffUnsupported", f"vLLM {vllm} has no num_speculative_tokens_per_batch_size (>= 0.24); "
                          "speculation stays on at every batch size"))  # fmt: skip
    return config, notes


def adaptive_refusal(inputs: Inputs) -> None:
    """Refuse adaptive verification where the pinned vLLM, the draft or the layout cannot have it
    (docs/reference/vllm.md: the V2 runner's enable_adaptive_verification)."""
    vllm, algo = inputs.release.vllm_version, inputs.draft.algorithm
    refusal = VLLM_FEATURES["adaptive_verification"].why_not(vllm, "adaptive verification")
    if refusal is None and algo == Algorithm.DFLASH2:
        refusal = VLLM_FEATURES["adaptive_verification_dflash2"].why_not(vllm, "adaptive verification of DFlash2")
    elif refusal is None and algo != Algorithm.DSPARK:
        refusal = f"vLLM {vllm} verifies adaptively for DSpark (and DFlash2 from 0.34) drafts only, not {algo}"
    if refusal is None and inputs.spec.serving.layout.pipeline > 1:
        refusal = "vLLM refuses adaptive verification with pipeline parallelism"
    if refusal is None and inputs.spec.serving.cutoff is not None:
        # the CRD's CEL rule says the same; an offline render (speculator-operator render) meets no apiserver
        refusal = "it and a serving.cutoff schedule cannot both decide K"
    if refusal is not None:
        raise RenderError(f"serving.adaptiveVerification: {refusal}")


def labels(name: str) -> dict[str, str]:
    return {
        NAME_LABEL: "speculator-deployment",
        INSTANCE_LABEL: name,
        MANAGED_BY_LABEL: MANAGED_BY,
        DEPLOYMENT_LABEL: name,
    }


def _owner(inputs: Inputs) -> list[dict[str, Any]]:
    return _owned_by(inputs.name, inputs.owner_uid)


def _owned_by(owner: str, uid: str | None) -> list[dict[str, Any]]:
    if not uid:
        return []
    return [{"apiVersion": API_VERSION, "kind": "SpeculatorDeployment", "name": owner, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}]  # fmt: skip


def capture_config_map(
    name: str, namespace: str, owner_uid: str | None, spec: SpeculatorDeploymentSpec, off: CaptureOff | None
) -> dict[str, Any]:
    """spec.learning's ConfigMap: the capture's live settings, on (None) or off for want of its storage. It needs
    nothing of the pair, so a pass that renders no pair still applies it."""
    meta: dict[str, Any] = {"name": capture.config_map_name(name), "namespace": namespace, "labels": labels(name)}
    if owner_uid:
        meta["ownerReferences"] = _owned_by(name, owner_uid)
    return capture.config_map(namespace, name, spec, off is None, meta)


def _meta(inputs: Inputs, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": inputs.namespace, "labels": labels(inputs.name)}
    owner = _owner(inputs)
    if owner:
        meta["ownerReferences"] = owner
    return meta


def pvc_volume(uri: str, name: str, mount: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, volumeMount) for pvc://claim/sub/path, mounted read-only at `mount`."""
    where = Location.parse(uri)
    claim, sub = where.root, where.path
    mount_spec: dict[str, Any] = {"name": name, "mountPath": mount, "readOnly": True}
    if sub.strip("/"):
        mount_spec["subPath"] = sub.strip("/")
    return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}, mount_spec


def _verifier_location(inputs: Inputs) -> tuple[str, list[str]]:
    """What vLLM is given as the model, and the extra args that pin it."""
    verifier = inputs.spec.verifier
    if not verifier.is_hub:
        return VERIFIER_DIR, []
    return verifier.location.root, ["--revision", inputs.verifier_revision or verifier.revision]


def vllm_args(inputs: Inputs) -> tuple[list[str], dict[str, Any] | None, list[tuple[str, str]]]:
    spec = inputs.spec
    config, notes = speculative_config(inputs, DRAFT_DIR)
    # a stitched MTP model is the verifier itself, with its MTP layers: vLLM serves it as the model
    model, pin = (DRAFT_DIR, []) if inputs.draft.stitched else _verifier_location(inputs)
    args = [
        "serve", model, *pin,
        "--served-model-name", spec.serving.served_model_name or inputs.name,
        "--host", "0.0.0.0",  # noqa: S104 - inside the pod; the Service is the way in
        "--port", str(PORT),
        "--tensor-parallel-size", str(spec.serving.layout.tensor),
        *parallel_args(spec.serving.layout),
        "--max-num-seqs", str(spec.serving.max_num_seqs),
        "--shutdown-timeout", str(spec.serving.shutdown_timeout_seconds),
    ]  # fmt: skip
    if config is not None:
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"), sort_keys=True)]
    if spec.verifier.quantization:
        args += ["--quantization", spec.verifier.quantization]
    # the capture's flags after the user's: a user's `--per-request-spec-decode-metrics none` gives way to the
    # capture's summary (their clients still see no metrics: the capture removes them)
    tail = capture.server_args(spec, speculating=config is not None) if spec.learning is not None else []
    return [*args, *spec.serving.extra_args, *tail], config, notes


def parallel_args(layout: Layout) -> list[str]:
    """The pipeline and data sizes beyond one (nothing for the one-GPU-group default: its command stays as it was)."""
    args = []
    if layout.pipeline > 1:
        args += ["--pipeline-parallel-size", str(layout.pipeline)]
    if layout.data > 1:
        args += ["--data-parallel-size", str(layout.data)]
    return args


def _revision_payload(inputs: Inputs, args: list[str]) -> dict[str, Any]:
    learning = inputs.spec.learning
    if learning is not None:  # where the pods write, beyond their flags: a storage change rolls them
        return {
            **_payload(inputs, args),
            "capture": capture.template_key(learning, inputs.capture_off is None or not inputs.capture_off.claim),
        }
    return _payload(inputs, args)


def _payload(inputs: Inputs, args: list[str]) -> dict[str, Any]:
    return {
        "verifier": [inputs.spec.verifier.model, inputs.verifier_revision or inputs.spec.verifier.revision],
        "draft": [
            inputs.draft_source or inputs.spec.speculator.source or inputs.spec.speculator.from_train_job,
            inputs.draft.revision,
        ],
        "release": inputs.release.name,
        "args": args,
    }


def revision_hash(inputs: Inputs, args: list[str]) -> str:
    """One hash over everything that must move together: verifier, draft, release, the server image (by digest
    where it is pinned, so a new build of the same tag is a new revision), rendered command."""
    payload = {**_revision_payload(inputs, args), "image": server_image(inputs)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def legacy_revision_hash(inputs: Inputs, args: list[str]) -> str:
    """The revision as operators named it before the server image entered the hash (up to fe501e0): the same
    payload without "image". Only to recognise a pair such an operator rolled out (planning/adoption.py)."""
    payload = _revision_payload(inputs, args)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _env_from(inputs: Inputs) -> list[dict[str, Any]]:
    secrets = {s.name for s in (inputs.spec.verifier.credentials, inputs.spec.speculator.credentials) if s}
    return [{"secretRef": {"name": name}} for name in sorted(secrets)]


def _stage(
    inputs: Inputs, source: str, dest: str, what: Kind, revision: str | None, manifest: Manifest | None
) -> dict[str, Any]:
    """The init container that stages exactly the audited files (each ReplicaSet keeps its own list)."""
    args = ["stage", source, dest, "--kind", what]
    if revision:
        args += ["--revision", revision]
    if manifest is not None:
        args += ["--manifest", manifest.to_arg()]
    return {
        "name": f"stage-{what}",
        "image": server_image(inputs),
        "command": ["speculator-operator"],
        "args": args,
        "envFrom": _env_from(inputs),
        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
        "securityContext": CONTAINER_SECURITY,
    }


def server_image(inputs: Inputs) -> str:
    """serving.image, else the release's server image for this package version (pinned to its digest where
    SPECULATOR_IMAGE_DIGESTS names one)."""
    return pinned(inputs.spec.serving.image) if inputs.spec.serving.image else inputs.release.image("server")


def render(inputs: Inputs) -> Rendered:
    spec, name = inputs.spec, inputs.name
    if name == "vllm":
        raise RenderError("a SpeculatorDeployment may not be named vllm (its Service would inject VLLM_PORT)")
    lay = spec.serving.layout
    refusal = inputs.release.parallel.refusal(inputs.release.name, lay, inputs.draft.algorithm)
    if refusal:
        raise RenderError(refusal, LAYOUT_UNSUPPORTED)
    args, config, notes = vllm_args(inputs)
    # a group's launch arguments are part of what must move together (one node adds none: its revision is as before)
    engine = args
    args = [*engine, *group.group_args(lay, group.LEADER)]
    revision = inputs.keep_revision or revision_hash(inputs, args)
    port = group.rendezvous(lay, revision)
    args = [*args, *port]
    resources = {k: dict(v) for k, v in (spec.serving.resources or {}).items()}
    resources.setdefault("limits", {}).setdefault(GPU, lay.gpus_per_pod)
    resources.setdefault("requests", {}).setdefault(GPU, resources["limits"][GPU])
    init = []
    volumes: list[dict[str, Any]] = [
        {"name": "models", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "models", "mountPath": "/models"}, {"name": "dshm", "mountPath": SHM}]
    source = inputs.draft_source or spec.speculator.source or ""
    stitched = inputs.draft.stitched
    draft_at, verifier_at = Location.parse(source), spec.verifier.location
    if draft_at.scheme in (Scheme.S3, Scheme.HUB):
        kind: Kind = "verifier" if stitched else "draft"  # served as the target: its tokenizer with it
        init.append(_stage(inputs, source, DRAFT_DIR, kind, inputs.draft.revision, inputs.draft.manifest))
    elif draft_at.is_pvc:
        volume, mount = pvc_volume(source, "draft", DRAFT_DIR)
        volumes.append(volume)
        mounts.append(mount)
    else:
        raise RenderError(f"speculator source {source!r}: expected hf://, s3:// or pvc://")
    if verifier_at.is_s3 and not stitched:
        verifier_stage = _stage(
            inputs, spec.verifier.model, VERIFIER_DIR, "verifier", inputs.verifier_revision, inputs.verifier_manifest
        )
        init.append(verifier_stage)
    elif verifier_at.is_pvc:
        volume, mount = pvc_volume(spec.verifier.model, "verifier", VERIFIER_DIR)
        volumes.append(volume)
        mounts.append(mount)
    # what the entrypoint audits the draft against: the mounted/staged copy, or the pinned hub commit
    if spec.verifier.is_hub:
        served_verifier = f"{spec.verifier.uri}@{inputs.verifier_revision or spec.verifier.revision}"
    elif stitched and verifier_at.is_s3:
        served_verifier = spec.verifier.model  # not staged: only its config.json is read, to audit against
    else:
        served_verifier = VERIFIER_DIR
    # the entrypoint audits the staged draft once more, then runs vLLM with exactly these arguments
    serve = ["speculator-operator", "serve", "--draft", DRAFT_DIR, "--verifier", served_verifier]
    serve += ["--release", inputs.release.name]
    if inputs.verifier_revision and not verifier_at.is_pvc:
        serve += ["--verifier-revision", inputs.verifier_revision]
    if inputs.verifier_content:
        serve += ["--verifier-content", inputs.verifier_content]
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": "/models/hf-home"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        *(spec.serving.env or []),
    ]
    container = {
        "name": "vllm",
        "image": server_image(inputs),
        "command": [*serve, "--"],
        "args": args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "envFrom": _env_from(inputs),
        "resources": resources,
        "volumeMounts": mounts,
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 180,
        },  # loading big models takes a while: up to 30 min
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": CONTAINER_SECURITY,
    }
    extra: list[dict[str, Any]] = []
    if spec.learning is not None:
        if inputs.capture_off is not None:
            notes = [*notes, (inputs.capture_off.reason, inputs.capture_off.message)]
        parts = _capture(inputs, revision, config)
        env += parts.env
        mounts += parts.mounts
        volumes += parts.volumes
        extra.append(capture_config_map(name, inputs.namespace, inputs.owner_uid, spec, inputs.capture_off))
    tolerations = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, *(spec.serving.tolerations or [])]
    pod_labels = {**labels(name), REVISION_LABEL: revision}
    # what this revision's pods stage: retention never deletes a location a ReplicaSet still names
    pod_annotations = {REVISION_LABEL: revision, DRAFT_ANNOTATION: source}
    security = POD_SECURITY
    if spec.learning is not None and Location.parse(spec.learning.storage.location).is_pvc:
        # the capture's claim grows to many thousands of shards: no recursive ownership change at every mount
        security = {**POD_SECURITY, "fsGroupChangePolicy": "OnRootMismatch"}
    pod: dict[str, Any] = {
        "securityContext": security,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.serving.shutdown_timeout_seconds + 30,
        "initContainers": init,
        "containers": [container],
        "tolerations": tolerations,
        "volumes": volumes,
    }
    if not init:
        del pod["initContainers"]
    if inputs.pull_secrets:
        pod["imagePullSecrets"] = pull_secret_refs(inputs.pull_secrets)
    if spec.serving.node_selector:
        pod["nodeSelector"] = dict(spec.serving.node_selector)
    selector = labels(name)
    if lay.multi_node:
        # one group per replica; the Service and the scrape reach the leaders only (the API server, /metrics)
        meta = {**_meta(inputs, workload_name(name, lay)), "annotations": {REVISION_LABEL: revision}}
        worker_args = [*engine, *group.group_args(lay, group.WORKER), *port]
        template_meta = {"labels": pod_labels, "annotations": pod_annotations}
        workload = group.leader_worker_set(meta, template_meta, pod, worker_args, lay, spec.serving.replicas)
        selector = {**selector, ROLE_LABEL: group.LEADER}
    else:
        workload = _deployment(inputs, revision, pod_labels, pod_annotations, pod)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(inputs, name),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(inputs, name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(name)}},
    }
    return Rendered([workload, service, pdb, *extra], args, config, revision, notes)


def _capture(inputs: Inputs, revision: str, config: dict[str, Any] | None) -> capture.PodParts:
    spec = inputs.spec
    pair = capture.Pair(
        revision=revision,
        verifier_revision=inputs.verifier_revision or spec.verifier.revision or "unresolved",
        draft_revision=inputs.draft.revision or "unresolved",
        k=num_speculative_tokens(spec, inputs.draft, inputs.tuned) if config is not None else 0,
        served_model=spec.serving.served_model_name or inputs.name,
    )
    off = inputs.capture_off
    return capture.pod_parts(inputs.namespace, inputs.name, spec, pair, claim=off is None or not off.claim)


def pull_secret_refs(names: tuple[str, ...]) -> list[dict[str, str]]:
    """A pod spec's `imagePullSecrets`: the Secrets (in the pod's namespace) its images are pulled with."""
    return [{"name": n} for n in names]


def workload_name(name: str, layout: Layout) -> str:
    """The serving workload's name: the deployment's own for a Deployment; for a LeaderWorkerSet a name of its own,
    since the LeaderWorkerSet controller makes a headless Service of that name (the client Service keeps `name`)."""
    return group_name(name) if layout.multi_node else name


def group_name(name: str) -> str:
    """The LeaderWorkerSet of the deployment `name` (whatever its layout now: a layout change looks for it)."""
    return f"{name}{GROUP_SUFFIX}"


def workload_kind(layout: Layout) -> tuple[str, str]:
    """(apiVersion, kind) of the workload that serves `layout`."""
    return (group.API_VERSION, group.KIND) if layout.multi_node else ("apps/v1", "Deployment")


def _deployment(
    inputs: Inputs, revision: str, pod_labels: dict[str, str], pod_annotations: dict[str, str], pod: dict[str, Any]
) -> dict[str, Any]:
    name = inputs.name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**_meta(inputs, name), "annotations": {REVISION_LABEL: revision}},
        "spec": {
            "replicas": inputs.spec.serving.replicas,
            "selector": {"matchLabels": labels(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": pod,
            },
        },
    }
