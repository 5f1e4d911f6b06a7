"""Retraining a SpeculatorDeployment's draft for a new verifier revision (upgradePolicy.onVerifierChange: Retrain,
or Redeploy with a train template when the draft fails its audit against it): the SpeculatorTrainJob to create,
the status while it runs, its output once it has succeeded, and when the pair stays pinned meanwhile. Pure."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from speculator_operator.api.common import API_VERSION, evolve, make_condition
from speculator_operator.api.deployment import RetrainStatus, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import RETRAINS_LABEL
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.planning import Problem
from speculator_operator.planning.inputs import AuditedReason, InputAction, VerifierReason
from speculator_operator.planning.writes import Create, Writes

TRAIN_JOBS = "speculatortrainjobs"


def retrain_name(name: str, revision: str, request: str | None = None) -> str:
    """The SpeculatorTrainJob that retrains `name` for a verifier revision (one per revision, and one per value of
    a retrain request: planning/requests.py)."""
    tag = re.sub(r"[^a-z0-9]", "", revision.lower().split(":")[-1])[:10] or "rev"
    if request is not None:
        tag = tag[:6] + hashlib.sha256(request.encode()).hexdigest()[:4]
    return f"{name[: 63 - len(tag) - 9]}-retrain-{tag}"


def retrain_job(
    name: str,
    namespace: str,
    uid: str | None,
    spec: SpeculatorDeploymentSpec,
    revision: str,
    request: str | None = None,
    kept_release: str | None = None,
) -> dict[str, Any]:
    """The SpeculatorTrainJob for the new verifier revision from upgradePolicy.trainTemplate; ValueError
    names what is wrong with the template. A template naming no release trains on the one the deployment serves (its
    spec's, else `kept_release`, its status.release), so that the draft comes back for the vLLM that will serve it."""
    release = spec.release or kept_release
    template = dict(spec.upgrade_policy.train_template or {})
    if not template:
        raise ValueError("upgradePolicy.trainTemplate is not set")
    for key in ("verifier", "deployTo"):
        if key in template:
            raise ValueError(f"upgradePolicy.trainTemplate.{key} is set by the operator; leave it out")
    verifier = spec.verifier.model_dump(by_alias=True, exclude_none=True, mode="json")
    if spec.verifier.is_hub:
        verifier["revision"] = revision  # train against exactly the revision that was resolved
    body = {**template, "verifier": verifier, "deployTo": name}
    if release and not template.get("release"):
        body["release"] = release
    try:
        SpeculatorTrainJobSpec.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"upgradePolicy.trainTemplate.{where}: {first['msg']}") from None
    meta: dict[str, Any] = {"name": retrain_name(name, revision, request), "namespace": namespace,
                            "labels": {RETRAINS_LABEL: name}}  # fmt: skip
    if uid:
        meta["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "SpeculatorDeployment", "name": name,
                                    "uid": uid, "controller": False, "blockOwnerDeletion": False}]  # fmt: skip
    return {"apiVersion": API_VERSION, "kind": "SpeculatorTrainJob", "metadata": meta, "spec": body}


def plan_retrain(
    name: str,
    namespace: str,
    uid: str | None,
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    generation: int,
    revision: str,
    request: str | None = None,
    *,
    now: datetime,
) -> tuple[SpeculatorDeploymentStatus, Writes]:
    """A retraining for the verifier revision `revision`: the SpeculatorTrainJob to create (once: its name is per
    revision, and per retrain request, so one that exists already was created before: a restart, or the last poll)
    and the status that names it; or, when the template cannot make one, the status and event that say why."""
    try:
        manifest = retrain_job(name, namespace, uid, spec, revision, request, kept_release=status.release)
    except ValueError as exc:
        said = ("Warning", "RetrainUnavailable", str(exc))
        return retrain_status(status, generation, None, revision, str(exc), now=now), Writes(events=(said,))
    job = manifest["metadata"]["name"]
    created = Writes(creates=(Create(TRAIN_JOBS, manifest),))
    return retrain_status(status, generation, job, revision, None, now=now), created


def retraining(job: str, revision: str) -> tuple[str, str, str]:
    """The event once the SpeculatorTrainJob `job` was created (not when it existed already)."""
    return "Normal", "Retraining", f"SpeculatorTrainJob {job} for verifier {revision}"


def retrain_status(status: SpeculatorDeploymentStatus, generation: int, job: str | None, revision: str,
                   error: str | None, *, now: datetime) -> SpeculatorDeploymentStatus:  # fmt: skip
    """VerifierCurrent=False while a retraining runs (or why it could not start); the pair keeps serving."""
    old = status.verifier_revision
    if job is None:
        message = f"the verifier moved from {old} to {revision}; no retraining: {error}; the current pair keeps serving"
        return evolve(
            status,
            generation,
            make_condition(generation, "VerifierCurrent", False, VerifierReason.RETRAIN_UNAVAILABLE, message),
            now=now,
        )
    message = (f"the verifier moved from {old} to {revision}; SpeculatorTrainJob {job} trains a draft for it; "
               "the current pair keeps serving until the new draft passes its audit")  # fmt: skip
    retraining = make_condition(generation, "VerifierCurrent", False, VerifierReason.RETRAINING, message)
    return evolve(status, generation, retraining, retrain=RetrainStatus(job=job, verifier_revision=revision), now=now)


def train_job_output(stj: dict[str, Any] | None, job: str, verifier_model: str) -> tuple[str, str | None] | Problem:
    """(checkpoint uri, credentials Secret) of the SpeculatorTrainJob `job` once it has succeeded (the stored
    object, None if it does not exist), or why it cannot be served yet."""
    if stj is None:
        return Problem(AuditedReason.TRAINJOB_PENDING, f"SpeculatorTrainJob {job!r} does not exist (yet)")
    spec, status = stj.get("spec") or {}, stj.get("status") or {}
    trained_for = (spec.get("verifier") or {}).get("model")
    if trained_for != verifier_model:
        said = (
            f"SpeculatorTrainJob {job!r} trains for verifier {trained_for!r}, this deployment serves {verifier_model!r}"
        )
        return Problem(AuditedReason.TRAINJOB_MISMATCH, said)
    phase = status.get("phase") or "Pending"
    if phase == "Failed":
        return Problem(
            AuditedReason.TRAINJOB_FAILED, f"SpeculatorTrainJob {job!r} failed at stage {status.get('stage')}"
        )
    uri = (status.get("checkpoint") or {}).get("uri")
    if phase != "Succeeded" or not uri:
        stage = f" (stage {status['stage']})" if status.get("stage") else ""
        return Problem(AuditedReason.TRAINJOB_PENDING, f"SpeculatorTrainJob {job!r} is {phase}{stage}")
    return uri, ((spec.get("output") or {}).get("credentials") or {}).get("name")


def holds_for_retrain(status: SpeculatorDeploymentStatus, generation: int, handed_over: str | None = None) -> bool:
    """A retraining is in flight and nothing was asked since: the pair stays pinned to its old verifier
    (a resumed operator must not move it to the new revision with the old draft), until the retraining's own job
    is the one just `handed_over` (planning/handover.py)."""
    retrain = status.retrain
    return retrain is not None and status.observed_generation == generation and handed_over != retrain.job


def retrain_refused(spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus) -> tuple[str, str] | None:
    """Why a retrain request (planning/requests.py) starts nothing, as an event's (reason, message): no template,
    or a retraining in flight; None when it may start one."""
    if not spec.upgrade_policy.train_template:
        return "RetrainUnavailable", "retrain requested: upgradePolicy.trainTemplate is not set"
    if status.retrain is not None:
        return "RetrainInFlight", f"retrain requested: SpeculatorTrainJob {status.retrain.job} is already retraining"
    return None


def retrain_due(
    spec: SpeculatorDeploymentSpec, action: InputAction, status: SpeculatorDeploymentStatus, revision: str
) -> bool:
    """Whether a new verifier revision starts a retraining: Retrain always (once per revision); Redeploy
    when the draft failed its audit against it (Degraded) and a train template is given."""
    if status.retrain is not None and status.retrain.verifier_revision == revision:
        return False
    if action == InputAction.RETRAIN:
        return True
    return action == InputAction.REDEPLOY and status.phase == "Degraded" and bool(spec.upgrade_policy.train_template)


def adopt_retrain(
    previous: SpeculatorDeploymentStatus, planned: SpeculatorDeploymentStatus
) -> SpeculatorDeploymentStatus:
    """The planned status, without `retrain` once the retrained pair is the one being rolled out."""
    retrain = previous.retrain
    if (
        retrain is not None
        and planned.phase in ("Deploying", "Ready")
        and planned.verifier_revision == retrain.verifier_revision
    ):
        return evolve(planned, None, retrain=None)
    return planned
