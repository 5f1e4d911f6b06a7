"""What every stage of a train job shares: the workspace paths, the inputs, the names and labels of the
children, and the pod and Job builders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speculator_operator.api.common import API_VERSION
from speculator_operator.api.labels import INSTANCE_LABEL, MANAGED_BY_LABEL, NAME_LABEL, STAGE_LABEL, TRAINJOB_LABEL
from speculator_operator.api.trainjob import PodOptions, SpeculatorTrainJobSpec
from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.domain.releases import Release, pinned
from speculator_operator.render.serving import (
    CONTAINER_SECURITY,
    GPU,
    MANAGED_BY,
    POD_SECURITY,
    PORT,
    SHM,
    SHM_SIZE,
    RenderError,
    pull_secret_refs,
)

WORKSPACE = "/workspace"
VERIFIER = f"{WORKSPACE}/verifier"
SOURCES = f"{WORKSPACE}/sources"
REGENERATED = f"{WORKSPACE}/regenerated/data.jsonl"
PREPARED = f"{WORKSPACE}/prepared"
HIDDEN_STATES = f"{WORKSPACE}/hidden_states"
HS_STAGING = f"{WORKSPACE}/hs-staging"
CHECKPOINTS = f"{WORKSPACE}/checkpoints"
CONVERT_SOURCE = f"{WORKSPACE}/convert-source"  # a third-party draft, staged for `speculators convert`
STITCHED = f"{WORKSPACE}/stitched"  # the verifier with the fine-tuned MTP layers (`speculators stitch-mtp`)
HELD_OUT = f"{WORKSPACE}/held-out/prompts.jsonl"  # the prompts of the samples split off before training
LOGS = f"{WORKSPACE}/logs"
OUTPUT_MOUNT = "/output"
RDZV_PORT = 29500
TRAINER_GRACE_SECONDS = 180  # speculators saves `interrupted/` on SIGTERM within a 120 s watchdog
# the vLLM servers a stage may talk to (the sweep's two: render/training/sweep.py)
SERVER_ROLES = ("verifier", "extractor", "evaluator", "sweeper-half", "sweeper-plain")


@dataclass(frozen=True)
class Inputs:
    name: str
    namespace: str
    spec: SpeculatorTrainJobSpec
    release: Release
    verifier_revision: str | None  # the resolved commit (hub) or config digest (s3)
    verifier_layers: int  # num_hidden_layers of the verifier
    owner_uid: str | None = None
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads (provenance)
    evaluation: dict[str, Any] | None = None  # what the evaluate stage measured (for the published record)
    sweep: dict[str, Any] | None = None  # the sweep's whole curve (domain/sweep.py), for the published record
    pull_secrets: tuple[str, ...] = ()  # imagePullSecrets of every pod (the operator's settings)


def final_checkpoint(inputs: Inputs) -> str:
    """What the audit reads and the publish writes: an mtp head stitched into its verifier, else the draft."""
    return STITCHED if inputs.spec.algorithm == Algorithm.MTP.value else CHECKPOINTS


@dataclass(frozen=True)
class Stage:
    name: str
    phase: str  # the resource's phase while this stage runs
    children: list[dict[str, Any]]  # the Job (and a headless Service for multi-node training)
    server: str | None = None  # the vLLM server role this stage's client talks to
    command: list[str] = field(default_factory=list)  # the exact tool command (provenance)


def verifier_layers(config: dict[str, Any]) -> int:
    """num_hidden_layers of a verifier's config.json (multimodal configs nest it under text_config)."""
    nested = config.get("text_config")
    n = (nested if isinstance(nested, dict) else config).get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RenderError(f"the verifier's config.json has no usable num_hidden_layers ({n!r})")
    return n


def verifier_facts(config: dict[str, Any]) -> tuple[int, str | None, int | None]:
    """(num_hidden_layers, model_type, max_position_embeddings) of a verifier's config.json; the last is
    None when rope scaling stretches the context (vLLM may then take longer samples)."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    model_type = str(text.get("model_type") or config.get("model_type") or "") or None
    positions = text.get("max_position_embeddings")
    scaled = text.get("rope_scaling") or (text.get("rope_parameters") or {}).get("factor")
    usable = positions if isinstance(positions, int) and not isinstance(positions, bool) and not scaled else None
    return verifier_layers(config), model_type, usable


def target_layers(inputs: Inputs) -> list[int]:
    """The layers the draft reads (speculators' default [2, L//2, L-3]); mtp reads the last layer only."""
    n = inputs.verifier_layers
    if inputs.spec.algorithm == Algorithm.MTP.value:
        return [n]
    ids = inputs.spec.draft.target_layer_ids or [2, n // 2, n - 3]
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise RenderError(f"draft.targetLayerIds {bad} outside the verifier's layers 0..{n - 1}")
    return list(ids)


def extraction_layers(inputs: Inputs) -> list[int]:
    """What vLLM extracts: the target layers and the last layer (the verifier's own last hidden state)."""
    ids = target_layers(inputs)
    return ids if inputs.spec.algorithm == Algorithm.MTP.value else [*ids, inputs.verifier_layers]


def _short(name: str, suffix: str, limit: int = 63) -> str:
    """`<name>-<suffix>`, shortened deterministically to fit a DNS label."""
    full = f"{name}-{suffix}"
    if len(full) <= limit:
        return full
    import hashlib

    digest = hashlib.sha256(full.encode()).hexdigest()[:6]
    return f"{name[: limit - len(suffix) - 8]}-{digest}-{suffix}"


def job_name(name: str, stage: str) -> str:
    return _short(name, stage, 52)  # pods of an Indexed Job append -<index> and a random suffix


def server_name(name: str, role: str) -> str:
    return _short(name, role)


def claim_name(inputs: Inputs) -> str:
    return inputs.spec.workspace.claim_name or _short(inputs.name, "workspace")


def labels(name: str, stage: str | None = None) -> dict[str, str]:
    out = {
        NAME_LABEL: "speculator-trainjob",
        INSTANCE_LABEL: name,
        MANAGED_BY_LABEL: MANAGED_BY,
        TRAINJOB_LABEL: name,
    }
    if stage:
        out[STAGE_LABEL] = stage
    return out


def make_meta(inputs: Inputs, name: str, stage: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": inputs.namespace, "labels": labels(inputs.name, stage)}
    if inputs.owner_uid:
        owner = {"apiVersion": API_VERSION, "kind": "SpeculatorTrainJob", "name": inputs.name, "uid": inputs.owner_uid}
        meta["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    return meta


def endpoint_of(inputs: Inputs, role: str) -> str:
    return f"http://{server_name(inputs.name, role)}.{inputs.namespace}.svc:{PORT}"


def secret_envs(*refs: Any) -> list[dict[str, Any]]:
    names = sorted({r.name for r in refs if r is not None})
    return [{"secretRef": {"name": n}} for n in names]


def _volumes(inputs: Inputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": claim_name(inputs)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    mounts = [{"name": "workspace", "mountPath": WORKSPACE}, {"name": "dshm", "mountPath": SHM}]
    return volumes, mounts


def _env() -> list[dict[str, Any]]:
    return [
        {"name": "HF_HOME", "value": f"{WORKSPACE}/hf-home"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


def _resources(opts: PodOptions, gpus: int) -> dict[str, Any]:
    resources = {k: dict(v) for k, v in (opts.resources or {}).items()}
    if gpus:
        resources.setdefault("limits", {}).setdefault(GPU, gpus)
        resources.setdefault("requests", {}).setdefault(GPU, resources["limits"][GPU])
    return resources


def make_pod(
    inputs: Inputs,
    stage: str,
    opts: PodOptions,
    container: dict[str, Any],
    gpus: int,
    extra_volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    volumes, mounts = _volumes(inputs)
    container = {
        **container,
        "image": pinned(opts.image) if opts.image else container["image"],
        "env": [*_env(), *container.get("env", []), *(opts.env or [])],
        "resources": _resources(opts, gpus),
        "volumeMounts": [*mounts, *container.get("volumeMounts", [])],
        # a failing stage leaves its log tail in the pod status, where the operator reads it
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": CONTAINER_SECURITY,
    }
    spec: dict[str, Any] = {
        "securityContext": POD_SECURITY,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [*volumes, *(extra_volumes or [])],
    }
    tolerations = [
        *([{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}] if gpus else []),
        *(opts.tolerations or []),
    ]
    if tolerations:
        spec["tolerations"] = tolerations
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if inputs.pull_secrets:
        spec["imagePullSecrets"] = pull_secret_refs(inputs.pull_secrets)
    meta: dict[str, Any] = {"labels": {**(opts.labels or {}), **labels(inputs.name, stage)}}
    if opts.annotations:
        meta["annotations"] = dict(opts.annotations)
    return {"metadata": meta, "spec": spec}


def make_job(
    inputs: Inputs,
    stage: str,
    opts: PodOptions,
    container: dict[str, Any],
    *,
    gpus: int = 0,
    completions: int = 1,
    retries: int | None = None,
    fail_fast_codes: tuple[int, ...] = (2,),
    extra_volumes: list[dict[str, Any]] | None = None,
    subdomain: str | None = None,
) -> dict[str, Any]:
    pod = make_pod(inputs, stage, opts, container, gpus, extra_volumes)
    pod["spec"]["restartPolicy"] = "Never"
    if stage == "train":
        pod["spec"]["terminationGracePeriodSeconds"] = TRAINER_GRACE_SECONDS
    if subdomain:
        pod["spec"]["subdomain"] = subdomain
    spec: dict[str, Any] = {
        "backoffLimit": inputs.spec.retries if retries is None else retries,
        "template": pod,
        # exit code 2 is bad usage or unreadable input: retrying cannot help; evictions do not count
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "main", "operator": "In", "values": list(fail_fast_codes)},
                },
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            ]
        },
    }
    if completions > 1:
        spec.update(completions=completions, parallelism=completions, completionMode="Indexed")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": make_meta(inputs, job_name(inputs.name, stage), stage),
        "spec": spec,
    }


def wrapped(stage: str, command: list[str]) -> list[str]:
    """The trainer entrypoint runs the real tool and reports the stage's outcome for the status."""
    return ["speculator-operator", "trainer", "run", "--stage", stage, "--", *command]


def make_container(image: str, args: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": image, "command": args[:1], "args": args[1:], **extra}
