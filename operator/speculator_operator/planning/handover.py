"""A train job's hand-over to the SpeculatorDeployment its `spec.deployTo` names, kept in the deployment's status.
Pure.

The train job writes no other object's spec: a GitOps tool (Argo CD's self-heal, Flux) re-applies the manifests
from git and would revert a spec the operator patched, undoing a retrained draft (docs/operations/gitops.md).
Instead the deployment takes the job's published location into `status.handedOver` and serves it in place of
`spec.speculator` until `spec.speculator` itself is edited (a new choice in git wins) or a later job hands over.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from speculator_operator.api.deployment import HandedOver, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.planning import Problem
from speculator_operator.planning.inputs import AuditedReason
from speculator_operator.planning.retrain import train_job_output

# (completionTime, uri) of each succeeded train job that names a deployment, by job name
Offers = Mapping[str, tuple[str, str]]


def speculator_digest(spec: SpeculatorDeploymentSpec) -> str:
    """What spec.speculator says, as a short digest: a hand-over holds while it is the same."""
    raw = json.dumps(spec.speculator.model_dump(by_alias=True, exclude_none=True, mode="json"), sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def served(spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus) -> HandedOver | None:
    """The hand-over to serve: the one in status, unless spec.speculator was edited since it was taken."""
    handed = status.handed_over
    return handed if handed is not None and handed.speculator == speculator_digest(spec) else None


def offer_due(offers: Offers, handed: HandedOver | None) -> str | None:
    """The train job to read: the one that succeeded last, unless it is the one handed over already or finished
    before it (a job listed again after a restart does not take back what a later one handed over)."""
    if not offers:
        return None
    job, (completed, uri) = max(offers.items(), key=lambda item: (item[1][0], item[0]))
    if handed is not None and (
        (handed.train_job, handed.uri) == (job, uri) or (handed.completion_time or "") > completed
    ):
        return None
    return job


def offer_of(stj: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """(deployment, job, completionTime, uri) that a train job as watched offers: one that names a deployment in
    spec.deployTo and has succeeded with a published location; None otherwise."""
    meta, status = stj.get("metadata") or {}, stj.get("status") or {}
    target, uri = (stj.get("spec") or {}).get("deployTo"), (status.get("checkpoint") or {}).get("uri")
    if not target or not uri or status.get("phase") != "Succeeded":
        return None
    return str(target), str(meta.get("name") or ""), str(status.get("completionTime") or ""), str(uri)


def take_offer(stj: dict[str, Any] | None, job: str, name: str, spec: SpeculatorDeploymentSpec) -> HandedOver | Problem:
    """The hand-over of train job `job` (the stored object, None when it is gone) to deployment `name`, or why not:
    it must name this deployment, have succeeded with a published location, and train for the verifier served."""
    if stj is not None and (stj.get("spec") or {}).get("deployTo") != name:
        return Problem(
            AuditedReason.TRAINJOB_MISMATCH, f"SpeculatorTrainJob {job!r} does not name {name!r} in spec.deployTo"
        )
    found = train_job_output(stj, job, spec.verifier.model)
    if isinstance(found, Problem):
        return found
    uri, credentials = found
    completed = str(((stj or {}).get("status") or {}).get("completionTime") or "")
    return HandedOver(train_job=job, uri=uri, credentials=credentials, completion_time=completed or None,
                      speculator=speculator_digest(spec))  # fmt: skip
