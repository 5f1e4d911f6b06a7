"""Rules that pair the draft with the verifier being served: hidden size, vocabulary, layers, architecture,
name and revision, and the publish record that proves which verifier and files the draft was published with.

All but verifier-name and provenance need the verifier's config (`needs="verifier"`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath

from speculator_operator.domain.algorithms import MTP_TRAINABLE_VERIFIERS, Algorithm
from speculator_operator.domain.checkpoint.manifest import PROVENANCE, select
from speculator_operator.domain.checkpoint.rules.base import AuditContext, Finding, Severity, _is_int, rule
from speculator_operator.domain.location import Location

MTP_VERIFIER_TYPES = MTP_TRAINABLE_VERIFIERS


@rule("verifier-hidden-size", Severity.ERROR, "draft and verifier hidden sizes agree", needs="verifier")
def verifier_hidden_size(ctx: AuditContext) -> Iterator[str | Finding]:
    h, vh = ctx.checkpoint.hidden_size, ctx.verifier_int("hidden_size")
    if vh is None:
        yield Finding("verifier-hidden-size", Severity.WARNING, "the verifier config has no hidden_size")
    elif h is not None and h != vh:
        yield f"draft hidden_size {h} != verifier hidden_size {vh}"


@rule("verifier-vocab", Severity.ERROR, "draft and verifier vocabularies agree", needs="verifier")
def verifier_vocab(ctx: AuditContext) -> Iterator[str | Finding]:
    v, vv = ctx.checkpoint.verifier_vocab_size, ctx.verifier_int("vocab_size")
    if vv is None:
        yield Finding("verifier-vocab", Severity.WARNING, "the verifier config has no vocab_size")
        return
    if v is not None and v != vv:
        yield f"the draft was built for a vocabulary of {v} but the verifier has {vv}"
    emb = ctx.checkpoint.tensor("embed_tokens.weight")
    if emb is not None and emb.shape and emb.shape[0] != vv:
        yield f"embed_tokens.weight has {emb.shape[0]} rows, the verifier vocabulary is {vv}"


@rule("verifier-layers", Severity.ERROR, "aux layer ids lie within the verifier's layers [0, L]", needs="verifier")
def verifier_layers(ctx: AuditContext) -> Iterator[str]:
    ck, layers = ctx.checkpoint, ctx.verifier_int("num_hidden_layers")
    ids = ck.aux_layer_ids
    if layers is None or not ids:
        return
    outside = [i for i in ids if i > layers]
    if outside:
        yield f"{ck.aux_ids_key} {ids}: {outside} beyond the verifier's {layers} layers (valid: 0..{layers})"


@rule("verifier-architecture", Severity.ERROR, "the recorded verifier architecture is the served one", needs="verifier")
def verifier_architecture(ctx: AuditContext) -> Iterator[str]:
    recorded = ctx.checkpoint.recorded_verifier.get("architectures")
    served = ctx.verifier.get("architectures") if ctx.verifier else None
    if (
        isinstance(recorded, list)
        and recorded
        and isinstance(served, list)
        and served
        and not set(recorded) & set(served)
    ):
        yield f"the draft was trained against {recorded}, the verifier is {served}"
    if ctx.checkpoint.algorithm == Algorithm.MTP:
        model_type = ctx.verifier_text.get("model_type")
        if model_type not in MTP_VERIFIER_TYPES:
            yield f"mtp needs a verifier with native MTP layers ({', '.join(MTP_VERIFIER_TYPES)}), got {model_type!r}"


@rule("verifier-name", Severity.WARNING, "the recorded verifier name is the one being served")
def verifier_name(ctx: AuditContext) -> Iterator[str | Finding]:
    recorded = ctx.checkpoint.recorded_verifier.get("name_or_path")
    if not isinstance(recorded, str):
        return
    if PurePosixPath(recorded).is_absolute():
        yield Finding(
            "verifier-name",
            Severity.INFO,
            f"the recorded verifier is a local path ({recorded}); serve with the long form and an explicit verifier",
        )
    served = ctx.served_verifier
    where = Location.parse(served or "")
    name = where.root if where.is_hub else (served or "").split("@")[0]
    if served and name.rstrip("/") != recorded.rstrip("/"):
        yield f"the draft records verifier {recorded!r} but {served!r} is being served (fine for a quantized "
        "or re-hosted copy of the same model; otherwise acceptance will collapse)"


@rule(
    "verifier-revision",
    Severity.ERROR,
    "the draft was trained for the verifier revision being served",
    needs="verifier",
)
def verifier_revision(ctx: AuditContext) -> Iterator[str | Finding]:
    """The structural rules cannot see a draft trained for another revision of the same model; the
    publish record can. A README-only hub commit moves the sha but not the content identity."""
    record = ctx.checkpoint.provenance or {}
    recorded, content, name = record.get("verifierRevision"), record.get("verifierContent"), record.get("verifier")
    served = ctx.served_verifier or "the served verifier"
    if not isinstance(recorded, str) or not recorded:
        if ctx.verifier_revision is not None:
            yield Finding(
                "verifier-revision",
                Severity.WARNING,
                f"no {PROVENANCE} records which verifier revision the draft was trained for: "
                f"its pairing with {served}@{ctx.verifier_revision} is unproven",
            )
        return
    if ctx.verifier_revision is None:
        yield Finding(
            "verifier-revision",
            Severity.WARNING,
            f"the draft was trained for {name}@{recorded} ({PROVENANCE}); "
            f"the revision of {served} is not known here: the pairing is unproven",
        )
    elif recorded != ctx.verifier_revision and not (content and content == ctx.verifier_content):
        yield (
            f"the draft was trained for verifier {name}@{recorded} ({PROVENANCE}) but {served} is at "
            f"{ctx.verifier_revision}: train a draft for this revision, or serve the one it was trained for"
        )


@rule("provenance", Severity.ERROR, "the publish record beside the draft is readable and names exactly its files")
def provenance(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    if ck.provenance_error:
        yield f"{PROVENANCE} is there but unusable: {ck.provenance_error}"
    files = (ck.provenance or {}).get("files")
    if ck.manifest is None or not isinstance(files, dict):
        return
    present = {f.name: f for f in ck.manifest.files if f.name != PROVENANCE}
    missing = sorted(set(select(files, "draft")) - set(present))
    if missing:
        yield f"{PROVENANCE} names {', '.join(missing)}, which the checkpoint does not hold"
    extra = sorted(set(present) - set(files))
    if extra:
        yield f"{', '.join(extra)} not named by {PROVENANCE}: added after the checkpoint was published"
    for name, entry in present.items():
        recorded = files.get(name)
        size = recorded.get("size") if isinstance(recorded, dict) else None
        if _is_int(size) and entry.size != size:
            yield f"{name} is {entry.size} bytes, {PROVENANCE} recorded {size}: replaced after the publish"
