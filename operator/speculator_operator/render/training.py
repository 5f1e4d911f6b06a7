"""Pure builders of a SpeculatorTrainJob's children: one Job per stage, the vLLM servers some stages
talk to, the workspace claim, and the exact `speculators` / vLLM command lines for the pinned release.

Facts (shared/reference/speculators.md §2-§5, §10; vllm.md §5):
- every `speculators` stage and vLLM mount one workspace at one path (/workspace): the extraction
  server returns its own absolute file paths, which the client moves or the trainer reads and deletes;
- the verifier is staged once into the workspace at the resolved revision, and that path is both
  vLLM's served model name and the trainer's --verifier-name-or-path (they must be equal);
- extraction asks vLLM for the target layers plus the last layer L; the trainer gets the target
  layers only;
- prepare-data skips token_freq.pt unless told otherwise: --no-skip-token-freq whenever a draft
  vocabulary is set;
- offline training says --on-missing raise (the default, generate, would silently go online);
  generate-offline-data gets --fail-on-error --validate-outputs (it exits 0 on skipped samples);
- regenerate-responses output is pretokenized: prepare-data needs no render endpoint for it;
  natural-language conversations need vLLM's render endpoint (--enable-scale-out from 0.30).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from speculator_operator.api.common import API_VERSION
from speculator_operator.api.trainjob import PodOptions, SpeculatorTrainJobSpec
from speculator_operator.releases import DFLASH_FAMILY, Release, supports
from speculator_operator.render.serving import (
    CONTAINER_SECURITY,
    GPU,
    MANAGED_BY,
    POD_SECURITY,
    PORT,
    SHM,
    SHM_SIZE,
    RenderError,
    pvc_volume,
)

WORKSPACE = "/workspace"
VERIFIER = f"{WORKSPACE}/verifier"
SOURCES = f"{WORKSPACE}/sources"
REGENERATED = f"{WORKSPACE}/regenerated/data.jsonl"
PREPARED = f"{WORKSPACE}/prepared"
HIDDEN_STATES = f"{WORKSPACE}/hidden_states"
HS_STAGING = f"{WORKSPACE}/hs-staging"
CHECKPOINTS = f"{WORKSPACE}/checkpoints"
LOGS = f"{WORKSPACE}/logs"
OUTPUT_MOUNT = "/output"
RDZV_PORT = 29500
TRAINER_GRACE_SECONDS = 180  # speculators saves `interrupted/` on SIGTERM within a 120 s watchdog
SERVER_ROLES = ("verifier", "extractor")

# Flags the operator renders for `speculators train`; training.extraArgs may not repeat them.
OWNED_TRAIN_FLAGS = frozenset({
    "--speculator-type", "--verifier-name-or-path", "--data-path", "--save-path", "--log-dir", "--epochs",
    "--total-seq-len", "--hidden-states-backend", "--hidden-states-path", "--on-missing", "--on-generate",
    "--vllm-endpoint", "--lr", "--num-layers", "--draft-arch", "--draft-vocab-size", "--block-size", "--ttt-steps",
    "--num-depths", "--num-speculative-steps", "--target-layer-ids", "--from-pretrained", "--fsdp-shard",
    "--dry-run", "--mooncake-master", "--config", "--dump-config", "--help", "--token-freq-path",
})  # fmt: skip

# `speculators train` flags of each pinned speculators version (the argparse parser's option strings;
# tests/workloads checks this list against the real parser).
_TRAIN_FLAGS_0_9_0 = """
--help --config --dump-config --speculator-type --dry-run --seed --deterministic-cuda --verifier-name-or-path
--trust-remote-code --from-pretrained --draft-config --num-layers --draft-arch --draft-hidden-act
--draft-mrope-full-head-hack --no-draft-mrope-full-head-hack --target-layer-ids --token-freq-path
--draft-vocab-size --d2t-path --t2d-path --mask-token-id --norm-before-residual --no-norm-before-residual
--embed-requires-grad --no-embed-requires-grad --norm-before-fc --no-norm-before-fc --fc-norm --norm-output
--no-norm-output --sliding-window --full-attention-indices --sliding-window-non-causal
--no-sliding-window-non-causal --draft-attn-impl --data-path --hidden-states-backend --total-seq-len
--train-data-ratio --hidden-states-dtype --num-workers --prefetch-factor --max-anchors --vllm-endpoint
--on-missing --on-generate --request-timeout --max-retries --generation-validation-retries
--max-consecutive-generation-failures --loss-implementation --loss-fn --ttt-steps --ttt-step-loss-decay
--optimizer --lr --weight-decay --muon-lr --muon-momentum --muon-weight-decay --muon-ns-steps
--muon-adjust-lr-fn --scheduler-type --scheduler-warmup-steps --scheduler-warmup-ratio --scheduler-total-steps
--scheduler-num-cosine-cycles --epochs --checkpoint-freq --save-best --no-resume-from-checkpoint --log-freq
--save-path --fsdp-shard --gradient-checkpointing --max-steps --logger --log-dir --run-name --block-size
--sample-from-anchor --no-sample-from-anchor --dflash-decay-gamma --per-position-loss-weight --dpace-alpha
--conv-kernel-size --conv-group-size --selector-rank --selector-top-k --selector-loss-alpha --markov-rank
--markov-head-type --enable-confidence-head --no-enable-confidence-head --confidence-head-with-markov
--no-confidence-head-with-markov --confidence-head-alpha --xpress-rank --xpress-mlp-ratio --num-jacobi-passes
--consistency-weight --consistency-passes --base-anchor-weight --ce-from-data --base-anchor-full-weight
--num-depths --down-sample-ratio --down-sample-ratio-min --num-speculative-steps --step-weight-beta
--hidden-states-path --mooncake-master --mooncake-metadata-server --mooncake-protocol --mooncake-device
--mooncake-global-segment-gib --mooncake-local-buffer-gib
"""
TRAIN_FLAGS: dict[str, frozenset[str]] = {"0.9.0": frozenset(_TRAIN_FLAGS_0_9_0.split())}


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


@dataclass(frozen=True)
class Stage:
    name: str
    phase: str  # the resource's phase while this stage runs
    children: list[dict[str, Any]]  # the Job (and a headless Service for multi-node training)
    server: str | None = None  # the vLLM server role this stage's client talks to
    command: list[str] = field(default_factory=list)  # the exact tool command (provenance)


def check_train_args(release: Release, args: list[str]) -> None:
    """training.extraArgs: flags of the pinned speculators only, none the operator renders."""
    known = TRAIN_FLAGS.get(release.speculators)
    if known is None:
        raise RenderError(f"no train flag list for speculators {release.speculators}")
    for arg in args:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag in OWNED_TRAIN_FLAGS:
            raise RenderError(f"training.extraArgs: {flag} is set by the operator (from the spec)")
        if flag not in known:
            import difflib

            close = difflib.get_close_matches(flag, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise RenderError(f"training.extraArgs: {flag} is not a flag of speculators {release.speculators} "
                              f"train{hint}")  # fmt: skip


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
    if inputs.spec.algorithm == "mtp":
        return [n]
    ids = inputs.spec.draft.target_layer_ids or [2, n // 2, n - 3]
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise RenderError(f"draft.targetLayerIds {bad} outside the verifier's layers 0..{n - 1}")
    return list(ids)


def extraction_layers(inputs: Inputs) -> list[int]:
    """What vLLM extracts: the target layers and the last layer (the verifier's own last hidden state)."""
    ids = target_layers(inputs)
    return ids if inputs.spec.algorithm == "mtp" else [*ids, inputs.verifier_layers]


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
        "app.kubernetes.io/name": "speculator-trainjob",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "speculators.dev/trainjob": name,
    }
    if stage:
        out["speculators.dev/stage"] = stage
    return out


def _meta(inputs: Inputs, name: str, stage: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": inputs.namespace, "labels": labels(inputs.name, stage)}
    if inputs.owner_uid:
        owner = {"apiVersion": API_VERSION, "kind": "SpeculatorTrainJob", "name": inputs.name, "uid": inputs.owner_uid}
        meta["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    return meta


def _endpoint(inputs: Inputs, role: str) -> str:
    return f"http://{server_name(inputs.name, role)}.{inputs.namespace}.svc:{PORT}"


def _secrets(*refs: Any) -> list[dict[str, Any]]:
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


def _pod(inputs: Inputs, stage: str, opts: PodOptions, container: dict[str, Any], gpus: int,
         extra_volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    volumes, mounts = _volumes(inputs)
    container = {
        **container,
        "env": [*_env(), *container.get("env", [])],
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
    tolerations = [*([{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}] if gpus else []),
                   *(opts.tolerations or [])]  # fmt: skip
    if tolerations:
        spec["tolerations"] = tolerations
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    meta: dict[str, Any] = {"labels": {**(opts.labels or {}), **labels(inputs.name, stage)}}
    if opts.annotations:
        meta["annotations"] = dict(opts.annotations)
    return {"metadata": meta, "spec": spec}


def _job(
    inputs: Inputs, stage: str, opts: PodOptions, container: dict[str, Any], *, gpus: int = 0, completions: int = 1,
    retries: int | None = None, fail_fast_codes: tuple[int, ...] = (2,),
    extra_volumes: list[dict[str, Any]] | None = None, subdomain: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    pod = _pod(inputs, stage, opts, container, gpus, extra_volumes)
    pod["spec"]["restartPolicy"] = "Never"
    if stage == "train":
        pod["spec"]["terminationGracePeriodSeconds"] = TRAINER_GRACE_SECONDS
    if subdomain:
        pod["spec"]["subdomain"] = subdomain
    spec: dict[str, Any] = {
        "backoffLimit": inputs.spec.retries if retries is None else retries,
        "template": pod,
        # exit code 2 is bad usage or unreadable input: retrying cannot help; evictions do not count
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                                  "values": list(fail_fast_codes)}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        ]},
    }  # fmt: skip
    if completions > 1:
        spec.update(completions=completions, parallelism=completions, completionMode="Indexed")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(inputs, job_name(inputs.name, stage), stage),
            "spec": spec}  # fmt: skip


def _wrapped(stage: str, command: list[str]) -> list[str]:
    """The trainer entrypoint runs the real tool and reports the stage's outcome for the status."""
    return ["speculator-operator", "trainer", "run", "--stage", stage, "--", *command]


def _container(image: str, args: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": image, "command": args[:1], "args": args[1:], **extra}


# ---- stages -------------------------------------------------------------------------------------------


def _data_locations(inputs: Inputs) -> list[tuple[str, str]]:
    """(source, what prepare-data is given): s3:// and pvc:// sources are fetched into the workspace."""
    out = []
    for i, src in enumerate(inputs.spec.data.sources):
        if src.startswith(("s3://", "pvc://")):
            leaf = src.rstrip("/").rsplit("/", 1)[-1]
            out.append((src, f"{SOURCES}/{i}/{leaf}"))
        else:
            out.append((src, src))
    return out


def _pvc_mounts(uris: list[str], prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str]]:
    """Read-only mounts of the claims behind pvc:// URIs; returns volumes, mounts and uri -> local path."""
    volumes, mounts, paths = [], [], {}
    claims: dict[str, str] = {}
    for uri in uris:
        claim, _, sub = uri.removeprefix("pvc://").partition("/")
        if claim not in claims:
            claims[claim] = f"src{len(claims)}"
            volume, mount = pvc_volume(f"pvc://{claim}", claims[claim], f"{prefix}/{claim}")
            volumes.append(volume)
            mounts.append(mount)
        paths[uri] = f"{prefix}/{claim}/{sub}"
    return volumes, mounts, paths


def fetch_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    command = ["speculator-operator", "trainer", "fetch", "--verifier", spec.verifier.uri, "--dest", VERIFIER]
    if inputs.verifier_revision:
        command += ["--revision", inputs.verifier_revision]
    fetched = [(s, d) for s, d in _data_locations(inputs) if s != d]
    regen = spec.data.regenerate
    if regen and regen.dataset.startswith(("s3://", "pvc://")):
        fetched.append((regen.dataset, f"{SOURCES}/regenerate/{regen.dataset.rstrip('/').rsplit('/', 1)[-1]}"))
    volumes, mounts, local = _pvc_mounts([s for s, _ in fetched if s.startswith("pvc://")], "/mnt/sources")
    for src, dest in fetched:
        command += ["--data", f"{local.get(src, src)}={dest}"]
    creds = _secrets(spec.verifier.credentials)
    container = _container(inputs.release.image("trainer"), command, envFrom=creds, volumeMounts=mounts)
    job = _job(inputs, "fetch", spec.stages.cpu, container, extra_volumes=volumes)
    return Stage("fetch", "Preparing", [job], command=command)


def regenerate_stage(inputs: Inputs) -> Stage | None:
    regen = inputs.spec.data.regenerate
    if regen is None:
        return None
    dataset = regen.dataset
    if dataset.startswith(("s3://", "pvc://")):
        dataset = f"{SOURCES}/regenerate/{dataset.rstrip('/').rsplit('/', 1)[-1]}"
    command = [
        "speculators", "regenerate-responses",
        "--endpoint", f"{_endpoint(inputs, 'verifier')}/v1/chat/completions",
        "--model", VERIFIER,
        "--dataset", dataset,
        "--outfile", REGENERATED,
        "--resume",
        "--concurrency", str(regen.concurrency),
        "--max-tokens", str(regen.max_tokens),
    ]  # fmt: skip
    for flag, value in (("--split", regen.split), ("--subset", regen.subset), ("--limit", regen.limit)):
        if value is not None:
            command += [flag, str(value)]
    if regen.sampling_params:
        command += ["--sampling-params", json.dumps(regen.sampling_params, separators=(",", ":"), sort_keys=True)]
    container = _container(inputs.release.image("trainer"), _wrapped("regenerate", command))
    return Stage("regenerate", "Regenerating", [_job(inputs, "regenerate", inputs.spec.stages.cpu, container)],
                 server="verifier", command=command)  # fmt: skip


def needs_render(inputs: Inputs) -> bool:
    return bool(inputs.spec.data.sources) and inputs.spec.data.format == "conversations"


def prepare_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    command = ["speculators", "prepare-data", "--model", VERIFIER]
    if spec.data.regenerate:
        command += ["--data", REGENERATED]
    for _, given in _data_locations(inputs):
        command += ["--data", given]
    command += ["--output", PREPARED, "--seq-length", str(spec.data.seq_length), "--overwrite"]
    if spec.data.max_samples:
        command += ["--max-samples", str(spec.data.max_samples)]
    if spec.draft.draft_vocab_size is not None:
        command.append("--no-skip-token-freq")  # else the trainer silently falls back to the full vocabulary
    server = None
    if needs_render(inputs):
        command += ["--render-endpoint", _endpoint(inputs, "verifier")]
        server = "verifier"
    container = _container(inputs.release.image("trainer"), _wrapped("prepare", command))
    return Stage("prepare", "Preparing", [_job(inputs, "prepare", spec.stages.cpu, container)], server=server,
                 command=command)  # fmt: skip


def extract_stage(inputs: Inputs) -> Stage | None:
    spec = inputs.spec
    if spec.hidden_states.mode != "offline" or spec.training.dry_run:
        return None
    ranks = spec.hidden_states.replicas
    command = [
        "speculators", "generate-offline-data",
        "--endpoint", f"{_endpoint(inputs, 'extractor')}/v1",
        "--model", VERIFIER,
        "--preprocessed-data", PREPARED,
        "--output", HIDDEN_STATES,
        "--concurrency", str(spec.hidden_states.concurrency),
        "--validate-outputs", "--fail-on-error",
    ]  # fmt: skip
    if spec.data.max_samples:
        command += ["--max-samples", str(spec.data.max_samples)]
    if ranks > 1:
        command += ["--world-size", str(ranks), "--rank", "$(JOB_COMPLETION_INDEX)"]
    container = _container(inputs.release.image("trainer"), _wrapped("extract", command))
    job = _job(inputs, "extract", spec.stages.cpu, container, completions=ranks)
    return Stage("extract", "Extracting", [job], server="extractor", command=command)


def train_command(inputs: Inputs) -> list[str]:
    """The `speculators train` flags (without the launcher)."""
    spec, draft = inputs.spec, inputs.spec.draft
    args = [
        "--speculator-type", spec.algorithm,
        "--verifier-name-or-path", VERIFIER,
        "--data-path", PREPARED,
        "--save-path", CHECKPOINTS,
        "--log-dir", LOGS,
        "--epochs", str(spec.training.epochs),
        "--total-seq-len", str(spec.data.seq_length),
        "--hidden-states-backend", spec.hidden_states.backend,
    ]  # fmt: skip
    if spec.algorithm != "mtp":
        args += ["--target-layer-ids", *map(str, target_layers(inputs))]
    optional: list[tuple[str, Any]] = [
        ("--lr", spec.training.lr), ("--num-layers", draft.num_layers), ("--draft-arch", draft.draft_arch),
        ("--draft-vocab-size", draft.draft_vocab_size), ("--from-pretrained", draft.from_pretrained),
    ]  # fmt: skip
    if spec.algorithm in DFLASH_FAMILY:
        optional.append(("--block-size", draft.block_size))
    if spec.algorithm == "eagle3":
        optional.append(("--ttt-steps", draft.ttt_steps))
    if spec.algorithm == "peagle":
        optional.append(("--num-depths", draft.num_depths))
    if spec.algorithm == "mtp":
        optional.append(("--num-speculative-steps", draft.num_speculative_steps))
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    if spec.training.dry_run:
        args.append("--dry-run")
    elif spec.hidden_states.mode == "offline":
        args += ["--hidden-states-path", HIDDEN_STATES, "--on-missing", "raise"]
    else:
        args += ["--vllm-endpoint", f"{_endpoint(inputs, 'extractor')}/v1", "--on-missing", "generate"]
    if spec.hidden_states.backend == "mooncake" and spec.hidden_states.mooncake_master:
        args += ["--mooncake-master", spec.hidden_states.mooncake_master]
    if spec.training.fsdp and not spec.training.dry_run:
        args.append("--fsdp-shard")
    check_train_args(inputs.release, spec.training.extra_args)
    return [*args, *spec.training.extra_args]


def train_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    flags = train_command(inputs)
    nodes, gpus = spec.training.nodes, spec.training.gpus_per_node
    children: list[dict[str, Any]] = []
    subdomain = None
    if spec.training.dry_run:
        command, nodes, gpus = ["speculators", "train", *flags], 1, 0
    elif nodes == 1:
        command = ["torchrun", "--standalone", "--nproc-per-node", str(gpus), "-m", "speculators.train", *flags]
    else:
        subdomain = job_name(inputs.name, "train")
        master = f"{subdomain}-0.{subdomain}.{inputs.namespace}.svc"
        command = [
            "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(gpus),
            "--node-rank", "$(JOB_COMPLETION_INDEX)", "--master-addr", master, "--master-port", str(RDZV_PORT),
            "-m", "speculators.train", *flags,
        ]  # fmt: skip
        children.append({
            "apiVersion": "v1", "kind": "Service", "metadata": _meta(inputs, subdomain, "train"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {"job-name": subdomain},
                     "ports": [{"name": "rendezvous", "port": RDZV_PORT, "targetPort": RDZV_PORT}]},
        })  # fmt: skip
    container = _container(inputs.release.image("trainer"), _wrapped("train", command),
                           ports=[{"name": "rendezvous", "containerPort": RDZV_PORT}] if nodes > 1 else [])  # fmt: skip
    if not container["ports"]:
        del container["ports"]
    # several nodes fail together: a restart of the group costs every node's progress, so the retry
    # budget counts pods
    job = _job(inputs, "train", spec.stages.trainer, container, gpus=gpus, completions=nodes,
               retries=spec.retries * nodes, subdomain=subdomain)  # fmt: skip
    server = "extractor" if spec.hidden_states.mode == "online" and not spec.training.dry_run else None
    return Stage("train", "Training", [job, *children], server=server, command=command)


def audit_stage(inputs: Inputs) -> Stage:
    command = ["speculator-operator", "trainer", "audit", CHECKPOINTS, "--verifier", VERIFIER]
    if inputs.spec.algorithm != "mtp":  # an mtp head is served only once stitched into its verifier
        command += ["--release", inputs.release.name]
    container = _container(inputs.release.image("trainer"), command)
    # 1: audit errors, 2: unreadable checkpoint - neither changes on a retry
    job = _job(inputs, "audit", inputs.spec.stages.cpu, container, fail_fast_codes=(1, 2))
    return Stage("audit", "Auditing", [job], command=command)


def publish_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    uri = spec.output.uri
    volumes, mounts = [], []
    target = uri
    if uri.startswith("pvc://"):
        claim, _, sub = uri.removeprefix("pvc://").partition("/")
        volumes = [{"name": "output", "persistentVolumeClaim": {"claimName": claim}}]
        mounts = [{"name": "output", "mountPath": OUTPUT_MOUNT}]
        target = f"{OUTPUT_MOUNT}/{sub}"
    command = [
        "speculator-operator", "trainer", "publish", CHECKPOINTS, target,
        "--verifier", spec.verifier.uri.removeprefix("hf://"),
        "--verifier-revision", inputs.verifier_revision or spec.verifier.revision,
        "--job", f"{inputs.namespace}/{inputs.name}",
        "--release", inputs.release.name,
        "--uri", uri,
    ]  # fmt: skip
    if inputs.verifier_content:
        command += ["--verifier-content", inputs.verifier_content]
    container = _container(inputs.release.image("trainer"), command, envFrom=_secrets(spec.output.credentials),
                           volumeMounts=mounts)  # fmt: skip
    job = _job(inputs, "publish", spec.stages.cpu, container, extra_volumes=volumes)
    return Stage("publish", "Publishing", [job], command=command)


def stages(inputs: Inputs) -> list[Stage]:
    """Every stage of this job, in order."""
    found = [
        fetch_stage(inputs), regenerate_stage(inputs), prepare_stage(inputs), extract_stage(inputs),
        train_stage(inputs), audit_stage(inputs), publish_stage(inputs),
    ]  # fmt: skip
    return [s for s in found if s is not None]


# ---- servers and the workspace ---------------------------------------------------------------------------


def kv_transfer_config(inputs: Inputs) -> dict[str, Any]:
    backend = inputs.spec.hidden_states.backend
    if backend == "mooncake":
        return {
            "kv_connector": "MooncakeHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_module_path": "hs_connectors.mooncake_hidden_states_connector",
            "kv_connector_extra_config": {"mooncake": {
                "master_server_address": inputs.spec.hidden_states.mooncake_master,
                "metadata_server": "P2PHANDSHAKE", "protocol": "tcp"}},
        }  # fmt: skip
    config: dict[str, Any] = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": HS_STAGING},
    }
    if backend == "fp8":
        config["kv_connector"] = "FP8HiddenStatesConnector"
        config["kv_connector_module_path"] = "hs_connectors.fp8_hidden_states_connector"
    return config


def _max_model_len(args: list[str]) -> int | None:
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--max-model-len" and i + 1 < len(args) else None
        if arg.startswith("--max-model-len="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise RenderError(f"hiddenStates.extraArgs: --max-model-len {value!r} is not a number") from None
    return None


def server_args(inputs: Inputs, role: str) -> list[str]:
    """`serve MODEL FLAGS...` for the plain verifier (regenerate, render) or the extraction server."""
    vllm = inputs.release.vllm_version
    hs = inputs.spec.hidden_states
    limit = _max_model_len(hs.extra_args)
    if limit is not None and limit < inputs.spec.data.seq_length:
        # seen with the real tools: prepare-data asks the render endpoint to truncate at seqLength and vLLM
        # refuses every row (400), and the extraction server would refuse the longer samples
        raise RenderError(f"hiddenStates.extraArgs sets --max-model-len {limit}, below data.seqLength "
                          f"{inputs.spec.data.seq_length}: the servers must take whole samples")  # fmt: skip
    args = [
        "serve", VERIFIER,
        "--served-model-name", VERIFIER,  # = the trainer's --verifier-name-or-path and the clients' --model
        "--host", "0.0.0.0",  # noqa: S104 - inside the pod; the Service is the way in
        "--port", str(PORT),
        "--tensor-parallel-size", str(hs.tensor_parallel_size),
    ]  # fmt: skip
    if role == "verifier":
        if needs_render(inputs) and supports(vllm, "enable_scale_out_flag"):
            args.append("--enable-scale-out")  # the render endpoint prepare-data posts to
        return [*args, *hs.extra_args]
    if not supports(vllm, "extract_hidden_states"):
        raise RenderError(f"hidden-state extraction needs vLLM >= 0.17, the release pins {inputs.release.vllm}")
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": extraction_layers(inputs)}},
    }
    return [
        *args,
        "--speculative-config",
        json.dumps(speculative, separators=(",", ":"), sort_keys=True),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(inputs), separators=(",", ":"), sort_keys=True),
        "--no-enable-chunked-prefill",
        *hs.extra_args,
    ]


def server(inputs: Inputs, role: str) -> list[dict[str, Any]]:
    """Deployment + Service of a vLLM server that a stage's client talks to."""
    spec = inputs.spec
    name = server_name(inputs.name, role)
    args = server_args(inputs, role)
    env: list[dict[str, Any]] = []
    if role == "extractor" and spec.hidden_states.backend == "mooncake":
        env.append({"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    container = _container(
        inputs.release.image("extraction"), ["speculator-operator", "vllm", "--", *args], env=env,
        ports=[{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        startupProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 180},
        readinessProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        livenessProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
    )  # fmt: skip
    pod = _pod(inputs, role, spec.stages.server, container, spec.hidden_states.tensor_parallel_size)
    selector = {**labels(inputs.name, role)}
    replicas = spec.hidden_states.replicas if role == "extractor" else 1
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(inputs, name, role),
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": pod},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(inputs, name, role),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }  # fmt: skip
    return [deployment, service]


def workspace_claim(inputs: Inputs) -> dict[str, Any] | None:
    ws = inputs.spec.workspace
    if ws.claim_name:
        return None
    spec: dict[str, Any] = {"accessModes": [ws.access_mode], "resources": {"requests": {"storage": ws.size}}}
    if ws.storage_class_name:
        spec["storageClassName"] = ws.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(inputs, claim_name(inputs), None),
            "spec": spec}  # fmt: skip


def render_all(inputs: Inputs) -> list[dict[str, Any]]:
    """Every child the job can have over its life (the `render` command's preview), in stage order."""
    out: list[dict[str, Any]] = []
    claim = workspace_claim(inputs)
    if claim:
        out.append(claim)
    seen: set[str] = set()
    for stage in stages(inputs):
        if stage.server and stage.server not in seen:
            seen.add(stage.server)
            out += server(inputs, stage.server)
        out += stage.children
    return out
