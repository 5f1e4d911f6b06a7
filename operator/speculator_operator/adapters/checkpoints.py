"""Checkpoints and verifiers read from where they live: the shell opens a location (adapters/sources.py) and hands
the source to the pure reading and audit in domain/checkpoint/."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Concatenate, ParamSpec

from speculator_operator.adapters.sources import open_source
from speculator_operator.domain.checkpoint.audit import AuditReport
from speculator_operator.domain.checkpoint.audit import audit as audit_checkpoint
from speculator_operator.domain.checkpoint.manifest import Kind
from speculator_operator.domain.checkpoint.model import (
    Checkpoint,
    CheckpointError,
    VerifierRef,
    config_file,
    read_checkpoint,
    read_verifier_ref,
)
from speculator_operator.domain.checkpoint.sources import MAX_SMALL_FILE, Source, SourceError
from speculator_operator.domain.location import Location

P = ParamSpec("P")


def open_checkpoint(location: str, credentials: Mapping[str, str] | None = None, kind: Kind = "draft") -> Source:
    """The source of a local path, `s3://bucket/prefix` or `hf://org/repo[@revision]`; CheckpointError when it
    cannot be opened. `credentials` (e.g. a Secret's data) take the place of the process environment."""
    try:
        return open_source(location, credentials, kind)
    except SourceError as exc:
        raise CheckpointError(str(exc)) from None


def load_checkpoint(
    location: str | Source, credentials: Mapping[str, str] | None = None, kind: Kind = "draft"
) -> Checkpoint:
    """Read config.json and every safetensors header, header only. `kind` chooses the files that make it up
    (a stitched MTP model is served as the target: its tokenizer counts, as a verifier's does)."""
    return read_checkpoint(open_checkpoint(location, credentials, kind) if isinstance(location, str) else location)


def load_served(location: str, credentials: Mapping[str, str] | None = None) -> Checkpoint:
    """A SpeculatorDeployment's checkpoint: a draft, or a stitched MTP model, which is read again as what it
    is served as (the target model, tokenizer and all) at the exact location a pointer led to."""
    ck = load_checkpoint(location, credentials)
    if not ck.stitched_mtp:
        return ck
    whole = load_checkpoint(ck.uri, credentials, kind="verifier")
    whole.resolved_from = ck.resolved_from
    return whole


def read_verifier(location: str, credentials: Mapping[str, str] | None = None) -> VerifierRef:
    """A verifier's config.json from a folder, s3:// or hf://, or a JSON file, with its revision and the
    files that make it up (config, weights, tokenizer: checkpoint/manifest.py)."""
    if Location.parse(location).is_path and location.endswith(".json"):
        try:
            with open(location, "rb") as fh:
                return VerifierRef(config_file(fh.read(MAX_SMALL_FILE + 1), location), None)
        except OSError as exc:
            raise CheckpointError(f"{location}: {exc.strerror or exc}") from None
    return read_verifier_ref(open_checkpoint(location, credentials, kind="verifier"))


def load_verifier_config(
    location: str, credentials: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], str | None]:
    """A verifier's config.json and its revision (see read_verifier)."""
    ref = read_verifier(location, credentials)
    return ref.config, ref.revision


def checkpoint_dir(root: Path) -> Path:
    """The checkpoint to audit and publish: checkpoint_best, else the last epoch, else the folder itself
    (a dry run writes straight into the save path)."""
    best = root / "checkpoint_best"
    if best.exists():
        return best.resolve()
    epochs = (
        sorted((int(p.name), p) for p in root.iterdir() if p.name.isdigit() and p.is_dir()) if root.is_dir() else []
    )
    if epochs:
        return epochs[-1][1]
    if (root / "config.json").exists():
        return root
    raise CheckpointError(f"{root}: no checkpoint_best, epoch folder or config.json")


def _opening(
    run: Callable[Concatenate[Source | Checkpoint, P], AuditReport],
) -> Callable[Concatenate[str | Source | Checkpoint, P], AuditReport]:
    def opened(checkpoint: str | Source | Checkpoint, /, *args: P.args, **kwargs: P.kwargs) -> AuditReport:
        return run(open_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint, *args, **kwargs)

    opened.__doc__ = f"The audit of a location (opened here), a source or a checkpoint.\n\n{run.__doc__}"
    return opened


audit = _opening(audit_checkpoint)
