"""A train job's output.keepLatest once it has published: list what was published under output.uri and what
the cluster still names, and plan the rest's deletion (the decisions: planning/retention.py; the deletes:
runtime/executor.py).

Without the whole cluster's view (a ReplicaSet or a custom resource that cannot be listed) nothing is
deleted: a location is removed only when it is known that nothing names it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from speculator_operator.adapters.sources import s3_client
from speculator_operator.api.labels import DEPLOYMENT_LABEL, MANAGED_BY_LABEL
from speculator_operator.api.trainjob import Retention, SpeculatorTrainJobSpec
from speculator_operator.domain.checkpoint.manifest import LATEST, PROVENANCE
from speculator_operator.domain.location import Location
from speculator_operator.planning.retention import PUBLISHED, Published, prunable, references, retention_status
from speculator_operator.planning.writes import DeleteFolders, Writes
from speculator_operator.render.serving import MANAGED_BY
from speculator_operator.runtime import kube
from speculator_operator.runtime.kube import CredentialsError, secret_data

log = logging.getLogger(__name__)


def _published(s3: Any, bucket: str, prefix: str) -> tuple[list[Published], str | None]:
    """The folders this project published directly under the prefix, and where the pointer leads."""
    base = f"{prefix}/" if prefix else ""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            name = common["Prefix"][len(base) :].rstrip("/")
            if not PUBLISHED.match(name):
                continue
            try:
                record = json.loads(s3.get_object(Bucket=bucket, Key=f"{base}{name}/{PROVENANCE}")["Body"].read())
            except s3.exceptions.NoSuchKey:
                continue  # not whole, or not ours: never a candidate
            found.append(Published(f"s3://{bucket}/{base}{name}", str(record.get("published") or "")))
    try:
        pointer = json.loads(s3.get_object(Bucket=bucket, Key=f"{base}{LATEST}")["Body"].read()).get("name")
    except s3.exceptions.NoSuchKey:
        pointer = None
    return found, f"s3://{bucket}/{base}{pointer}" if pointer else None


def _cluster_references(pointer: str | None) -> set[str] | None:
    serving = f"{MANAGED_BY_LABEL}={MANAGED_BY},{DEPLOYMENT_LABEL}"  # a train job's servers stage no published draft
    replicasets = kube.list_objects("apps/v1", "ReplicaSet", label_selector=serving)
    jobs = kube.list_custom("speculatortrainjobs")
    deps = kube.list_custom("speculatordeployments")
    return references(replicasets, jobs, deps, pointer)


def prune_failed(namespace: str, name: str, spec: SpeculatorTrainJobSpec, error: object) -> tuple[str, str, str]:
    """The event when output.keepLatest could not be applied (retried later)."""
    message = f"output.keepLatest not applied to {spec.output.uri}: {error}"[:1024]
    log.warning("%s/%s: %s", namespace, name, message)
    return ("Warning", "PruneFailed", message)


def plan_prune(namespace: str, name: str, spec: SpeculatorTrainJobSpec, keep: int) -> tuple[Writes, Retention | None]:
    """The published folders under output.uri beyond the newest `keep` that nothing names, to delete, with the
    events to say once they are gone, and status.retention then (the pass writes it once the executor deleted
    them). A listing that fails plans nothing but its PruneFailed event (None: retried later)."""
    from botocore.exceptions import BotoCoreError, ClientError

    output = Location.parse(spec.output.uri)
    bucket, prefix = output.root, output.path.strip("/")
    try:
        creds = secret_data(namespace, spec.output.credentials.name if spec.output.credentials else None)
        s3 = s3_client(creds)
        locations, pointer = _published(s3, bucket, prefix)
        named = _cluster_references(pointer)
    except (CredentialsError, ApiException, ClientError, BotoCoreError) as exc:
        return Writes(events=(prune_failed(namespace, name, spec, exc),)), None
    # a ReplicaSet that does not say which draft it stages: every older folder is kept
    delete, kept = prunable(locations, {p.uri for p in locations} if named is None else named, keep)
    events = []
    if named is None and kept:
        message = (f"kept {len(kept)} published folder(s) beyond the newest {keep}: a serving ReplicaSet without "
                   f"the speculators.dev/draft-location annotation may stage any of them")  # fmt: skip
        events.append(("Normal", "PruneDeferred", message))
    if delete:
        message = f"deleted {len(delete)} published folder(s) beyond the newest {keep}: {', '.join(delete)}"
        events.append(("Normal", "Pruned", message[:1024]))
    folders = DeleteFolders(tuple(delete), creds)
    return Writes(folders=folders, events=tuple(events)), retention_status(keep, delete, kept)
