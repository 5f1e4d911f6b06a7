"""Retention of published checkpoints: which content-addressed folders under an output.uri may be deleted.

The rule (opt-in with `output.keepLatest`, s3:// only): the newest `keepLatest` published folders stay;
an older one is deleted only when nothing names it:
- a serving ReplicaSet's pod template, by its `speculators.dev/draft-location` annotation (at any replica
  count: a Deployment can roll back to it, and a replica of its revision that restarts stages exactly that
  location); one without the annotation (written before it) keeps every older folder, since what it stages
  is not said in a field,
- a SpeculatorTrainJob's status.checkpoint.uri,
- a SpeculatorDeployment's spec.speculator.source or status.draftSource,
- the `speculators-latest.json` pointer.
Only folders this project published are candidates (named `sha256-<16 hex>` and holding a provenance
record); anything else under the prefix is never touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from speculator_operator.api.labels import DRAFT_ANNOTATION
from speculator_operator.api.trainjob import Retention
from speculator_operator.domain.location import Location

PUBLISHED = re.compile(r"^sha256-[0-9a-f]{16}$")


@dataclass(frozen=True)
class Published:
    uri: str  # s3://bucket/prefix/sha256-...
    published: str  # RFC 3339, from the provenance record


def _norm(uri: str) -> str:
    return uri.rstrip("/")


def prunable(locations: Iterable[Published], referenced: Iterable[str], keep: int) -> tuple[list[str], list[str]]:
    """(to delete, older ones kept because something names them), each sorted."""
    named = {_norm(u) for u in referenced}
    newest = sorted(locations, key=lambda p: (p.published, p.uri), reverse=True)
    older = newest[keep:]
    delete = sorted(p.uri for p in older if _norm(p.uri) not in named)
    kept = sorted(p.uri for p in older if _norm(p.uri) in named)
    return delete, kept


def references(
    replicasets: Iterable[dict[str, Any]],
    train_jobs: Iterable[dict[str, Any]],
    deployments: Iterable[dict[str, Any]],
    pointer: str | None,
) -> set[str] | None:
    """Every checkpoint location the cluster's objects name (see the module docstring), or None when a serving
    ReplicaSet does not say which draft it stages (one written before its pod template carried
    speculators.dev/draft-location): then no older folder is known to be unnamed."""
    out = {pointer} if pointer else set()
    for rs in replicasets:
        template = ((rs.get("spec") or {}).get("template")) or {}
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        if not annotations.get(DRAFT_ANNOTATION):
            return None
        out.add(annotations[DRAFT_ANNOTATION])
    for stj in train_jobs:
        uri = (((stj.get("status") or {}).get("checkpoint")) or {}).get("uri")
        if uri:
            out.add(uri)
    for sdep in deployments:
        source = (((sdep.get("spec") or {}).get("speculator")) or {}).get("source")
        served = (sdep.get("status") or {}).get("draftSource")
        out.update(u for u in (source, served) if u)
    return {_norm(u) for u in out}


def retention_due(keep_latest: int | None, output_uri: str, status: dict[str, Any]) -> bool:
    """Whether a succeeded job still has to apply output.keepLatest (once, after its publish)."""
    return bool(keep_latest) and Location.parse(output_uri).is_s3 and "retention" not in status


def retention_status(keep_latest: int, deleted: list[str], kept: list[str]) -> Retention:
    return Retention(keep_latest=keep_latest, deleted=deleted, kept=kept)
