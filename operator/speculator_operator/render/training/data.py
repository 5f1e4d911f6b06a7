"""The data stages: fetch (verifier and sources into the workspace), regenerate (on-policy responses from the
verifier), prepare (`speculators prepare-data`)."""

from __future__ import annotations

import json
from typing import Any

from speculator_operator.domain.location import Location, Scheme
from speculator_operator.render.serving import (
    pvc_volume,
)
from speculator_operator.render.training import common
from speculator_operator.render.training.common import (
    CONVERT_SOURCE,
    HELD_OUT,
    PREPARED,
    REGENERATED,
    SOURCES,
    VERIFIER,
    Inputs,
    Stage,
)


def _fetched(uri: str) -> bool:
    """Whether the fetch stage copies a data source into the workspace (s3:// and pvc://; the rest prepare-data
    reads itself)."""
    return Location.parse(uri).scheme in (Scheme.S3, Scheme.PVC)


def _data_locations(inputs: Inputs) -> list[tuple[str, str]]:
    """(source, what prepare-data is given): s3:// and pvc:// sources are fetched into the workspace."""
    out = []
    for i, src in enumerate(inputs.spec.dataset.sources):
        if _fetched(src):
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
        where = Location.parse(uri)
        claim, sub = where.root, where.path
        if claim not in claims:
            claims[claim] = f"src{len(claims)}"
            volume, mount = pvc_volume(f"pvc://{claim}", claims[claim], f"{prefix}/{claim}")
            volumes.append(volume)
            mounts.append(mount)
        paths[uri] = f"{prefix}/{claim}/{sub}"
    return volumes, mounts, paths


def fetch_stage(inputs: Inputs) -> Stage:
    """The verifier at its resolved revision, and the data (a training job) or the third-party draft (a
    convert job), into the workspace."""
    spec = inputs.spec
    command = ["speculator-operator", "trainer", "fetch", "--verifier", spec.verifier.uri, "--dest", VERIFIER]
    if inputs.verifier_revision:
        command += ["--revision", inputs.verifier_revision]
    fetched = [] if spec.data is None else [(s, d) for s, d in _data_locations(inputs) if s != d]
    regen = spec.data.regenerate if spec.data is not None else None
    if regen and _fetched(regen.dataset):
        fetched.append((regen.dataset, f"{SOURCES}/regenerate/{regen.dataset.rstrip('/').rsplit('/', 1)[-1]}"))
    convert = spec.convert
    pvcs = [s for s, _ in fetched if Location.parse(s).is_pvc]
    if convert is not None and Location.parse(convert.source).is_pvc:
        pvcs.append(convert.source)
    volumes, mounts, local = _pvc_mounts(pvcs, "/mnt/sources")
    for src, dest in fetched:
        command += ["--data", f"{local.get(src, src)}={dest}"]
    if convert is not None:
        command += ["--convert", f"{local.get(convert.source, convert.source)}={CONVERT_SOURCE}"]
        if convert.revision:
            command += ["--convert-revision", convert.revision]
    creds = common.secret_envs(spec.verifier.credentials, convert.credentials if convert is not None else None)
    container = common.make_container(inputs.release.image("trainer"), command, envFrom=creds, volumeMounts=mounts)
    job = common.make_job(inputs, "fetch", spec.stages.cpu, container, extra_volumes=volumes)
    return Stage("fetch", "Preparing", [job], command=command)


def regenerate_stage(inputs: Inputs) -> Stage | None:
    regen = inputs.spec.dataset.regenerate
    if regen is None:
        return None
    dataset = regen.dataset
    if _fetched(dataset):
        dataset = f"{SOURCES}/regenerate/{dataset.rstrip('/').rsplit('/', 1)[-1]}"
    command = [
        "speculators", "regenerate-responses",
        "--endpoint", f"{common.endpoint_of(inputs, 'verifier')}/v1/chat/completions",
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
    container = common.make_container(inputs.release.image("trainer"), common.wrapped("regenerate", command))
    return Stage(
        "regenerate",
        "Regenerating",
        [common.make_job(inputs, "regenerate", inputs.spec.stages.cpu, container)],
        server="verifier",
        command=command,
    )


def needs_render(inputs: Inputs) -> bool:
    return bool(inputs.spec.dataset.sources) and inputs.spec.dataset.format == "conversations"


def prepare_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    command = ["speculators", "prepare-data", "--model", VERIFIER]
    if spec.dataset.regenerate:
        command += ["--data", REGENERATED]
    for _, given in _data_locations(inputs):
        command += ["--data", given]
    command += ["--output", PREPARED, "--seq-length", str(spec.dataset.seq_length), "--overwrite"]
    if spec.dataset.max_samples:
        command += ["--max-samples", str(spec.dataset.max_samples)]
    if spec.draft.draft_vocab_size is not None:
        command.append("--no-skip-token-freq")  # else the trainer silently falls back to the full vocabulary
    server = None
    if needs_render(inputs):
        command += ["--render-endpoint", common.endpoint_of(inputs, "verifier")]
        server = "verifier"
    wrapped = common.wrapped("prepare", command)
    ev = spec.evaluation
    if ev is not None and not ev.prompts:
        # the evaluation's samples leave the prepared data here, before extraction and training see it
        wrapped[5:5] = ["--hold-out", str(ev.held_out), "--held-out-file", HELD_OUT]
    container = common.make_container(inputs.release.image("trainer"), wrapped)
    return Stage(
        "prepare",
        "Preparing",
        [common.make_job(inputs, "prepare", spec.stages.cpu, container)],
        server=server,
        command=command,
    )
