"""The SpeculatorDeployment planner: pure decisions from what was observed to what should exist.

`plan(...)` gets the spec, the observed world (resolved verifier revision, the draft's audit, the
current child Deployment) and returns the children to apply (or None: leave them as they are), the
status to write and the events to post. The kopf handlers only gather the observations and apply.

Phases: Pending (waiting for an input), Auditing, Deploying (children applied, not all replicas of
the current revision ready), Ready, Degraded (the new pair failed its audit while the last good pair
keeps serving), Failed (nothing can be served).

Condition reasons:
- Audited: AuditPassed | AuditFailed | CheckpointUnreadable | VerifierUnreadable | CredentialsUnreadable |
  TrainJobPending | TrainJobFailed | TrainJobMismatch
- VerifierCurrent: RevisionResolved | VerifierChanged (Pause) | Retraining | RetrainUnavailable
- DraftCurrent: RevisionResolved | DraftChanged (the draft's bytes moved under the same source; Pause)
- Serving: RolledOut | RollingOut | ScaledToZero | NotDeployed | ApplyFailed | FailedCreate (no pod admitted:
  Pod Security, a quota) | a stuck pod's reason (planning/pods.py)
- Ready: Ready | RollingOut | AuditFailed | InvalidSpec | ReleaseUnsupported | WaitingForInputs | ApplyFailed
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from speculator_operator.api.common import API_VERSION, condition, make_condition, merge_status
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.labels import RETRAINS_LABEL, REVISION_LABEL
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.domain.checkpoint import AuditReport, Checkpoint, Manifest
from speculator_operator.domain.releases import Release
from speculator_operator.planning import Problem
from speculator_operator.planning.adoption import kept_revision
from speculator_operator.planning.pods import first_problem
from speculator_operator.planning.tuning import applied
from speculator_operator.render.serving import Inputs, RenderError, draft_of, num_speculative_tokens, render

MAX_FINDINGS = 20


class InputAction(StrEnum):
    """What a newly resolved verifier or draft revision asks for (upgradePolicy)."""

    NONE = "none"
    REDEPLOY = "redeploy"
    RETRAIN = "retrain"
    PAUSE = "pause"


class VerifierReason(StrEnum):
    """The VerifierCurrent condition's reasons (decisions read them only as these)."""

    RESOLVED = "RevisionResolved"
    CHANGED = "VerifierChanged"
    RETRAINING = "Retraining"
    RETRAIN_UNAVAILABLE = "RetrainUnavailable"


@dataclass
class Observed:
    generation: int
    status: dict[str, Any]
    verifier_revision: str | None = None
    audit: AuditReport | None = None
    problem: tuple[str, str] | None = None  # (reason, message) when an input could not be read
    child: dict[str, Any] | None = None  # the current Deployment, if any
    draft_source: str | None = None
    pods: list[dict[str, Any]] | None = None  # its pods, read only while it is not rolled out
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads
    verifier_manifest: Manifest | None = None  # an s3 verifier's files, for the pods' stage container
    cost_ratio: float | None = None  # draft / verifier parameters per token, when the verifier's config was read


@dataclass
class Plan:
    children: list[dict[str, Any]] | None
    status: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def audit_summary(report: AuditReport) -> dict[str, Any]:
    findings = [f.as_dict() for f in report.findings if f.severity != "info"][:MAX_FINDINGS]
    return {
        "ok": report.ok,
        "errors": len(report.errors),
        "warnings": sum(1 for f in report.findings if f.severity == "warning"),
        "findings": findings,
    }


def failed(obs: Observed, reason: str, message: str, phase: str = "Failed") -> Plan:
    gen = obs.generation
    status = merge_status(obs.status, gen, make_condition(gen, "Ready", False, reason, message), phase=phase)
    return Plan(None, status, [("Warning", reason, message)])


def serving_status(
    spec: SpeculatorDeploymentSpec,
    revision: str | None,
    child: dict[str, Any] | None,
    pods: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Replica counts and the Serving readiness of the current revision, from the child Deployment; while
    not rolled out, a stuck pod of that revision (an image the node cannot get, a crash loop) gives the
    reason and the kubelet's words."""
    want = spec.serving.replicas
    if child is None:
        return {"ready": False, "reason": "NotDeployed", "replicas": want, "readyReplicas": 0, "updatedReplicas": 0}
    st = child.get("status") or {}
    meta = child.get("metadata") or {}
    current = (meta.get("annotations") or {}).get(REVISION_LABEL) == revision
    observed = st.get("observedGeneration", 0) >= meta.get("generation", 0)
    ready, updated = st.get("readyReplicas", 0) or 0, st.get("updatedReplicas", 0) or 0
    available = st.get("availableReplicas", 0) or 0
    done = current and observed and updated >= want and available >= want and (st.get("replicas", 0) or 0) == want
    reason = "ScaledToZero" if want == 0 and done else ("RolledOut" if done else "RollingOut")
    out = {"ready": done, "reason": reason, "replicas": want, "readyReplicas": ready,
           "updatedReplicas": updated if current else 0}  # fmt: skip
    if not done and pods:
        mine = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL) == revision]
        problem = first_problem(mine)
        if problem:
            out["reason"], out["problem"] = problem
    failure = next((c for c in st.get("conditions") or [] if c.get("type") == "ReplicaFailure"), None)
    if not done and failure and failure.get("status") == "True":
        # no pod could be created at all (Pod Security admission, a quota): the API server's words
        out["reason"], out["problem"] = "FailedCreate", str(failure.get("message") or failure.get("reason"))[:1000]
    return out


SERVER_CONTAINER = "vllm"


def served_image(revision: str, pods: list[dict[str, Any]]) -> dict[str, str] | None:
    """What the kubelet runs for `revision`: the rendered image and the imageID every ready pod of the revision
    reports for its server container (`ServedImage` on the wire); None while a ready pod reports none (kwok's
    fake pods) or two pods report different ones (a tag that moved between two pulls: not one image)."""
    seen: set[tuple[str, str]] = set()
    for pod in pods:
        if ((pod.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL) != revision:
            continue
        rendered = {c.get("name"): c.get("image") for c in (pod.get("spec") or {}).get("containers") or []}
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") == SERVER_CONTAINER and cs.get("ready"):
                if not cs.get("imageID"):
                    return None
                seen.add((str(rendered.get(SERVER_CONTAINER) or cs.get("image") or ""), str(cs["imageID"])))
    if len(seen) != 1:
        return None
    image, image_id = seen.pop()
    return {"revision": revision, "image": image, "imageId": image_id}


def _what(ck: Checkpoint) -> str:
    return "stitched MTP model" if ck.stitched_mtp else f"{ck.algorithm} draft"


def plan(
    name: str, namespace: str, uid: str | None, spec: SpeculatorDeploymentSpec, release: Release, obs: Observed
) -> Plan:
    gen = obs.generation
    if obs.problem is not None:
        reason, message = obs.problem
        keep = obs.child is not None
        status = merge_status(
            obs.status, gen,
            make_condition(gen, "Audited", None, reason, message),
            make_condition(gen, "Ready", False if not keep else None, "WaitingForInputs", message),
            phase="Degraded" if keep else "Pending",
        )  # fmt: skip
        return Plan(None, status, [("Warning", reason, message)])
    report = obs.audit
    assert report is not None
    ck = report.checkpoint
    common = {
        "release": release.name,
        "vllm": release.vllm,
        "algorithm": Algorithm.MTP.value if ck.stitched_mtp else ck.algorithm,
        "verifierRevision": obs.verifier_revision,
        "draftRevision": ck.revision,
        "draftSource": obs.draft_source or spec.speculator.source,
        "audit": audit_summary(report),
        "economics": {
            "costRatio": None if obs.cost_ratio is None else round(obs.cost_ratio, 6),
            "maxK": ck.mtp_layers if ck.stitched_mtp else ck.speculative_tokens,
        },
    }
    verifier_cond = make_condition(
        gen, "VerifierCurrent", True, VerifierReason.RESOLVED, f"verifier at {obs.verifier_revision}"
    )
    draft_cond = make_condition(gen, "DraftCurrent", True, "RevisionResolved", f"draft at {ck.revision}")
    if not report.ok:
        first = report.errors[0]
        message = f"{len(report.errors)} audit error(s); first: {first.rule}: {first.message}"
        keep = obs.child is not None
        status = merge_status(
            obs.status, gen,
            make_condition(gen, "Audited", False, "AuditFailed", message),
            verifier_cond,
            draft_cond,
            make_condition(gen, "Ready", False, "AuditFailed",
                           message + ("; the last good pair keeps serving" if keep else "")),
            phase="Degraded" if keep else "Failed",
            **common,
        )  # fmt: skip
        return Plan(None, status, [("Warning", "AuditFailed", message)])
    try:
        draft = draft_of(ck)
    except RenderError as exc:
        return failed(obs, "AuditFailed", str(exc))
    tuned = applied(spec, obs.status.get("tuning"), draft.speculative_tokens)
    inputs = Inputs(
        name,
        namespace,
        spec,
        release,
        draft,
        obs.verifier_revision,
        uid,
        obs.draft_source,
        obs.verifier_content,
        obs.verifier_manifest,
        tuned,
    )
    try:
        rendered = render(inputs)
        kept = kept_revision(inputs, rendered, obs.status.get("revision"), obs.child)
        if kept is not None:  # an earlier operator's name for this same pair: no rollout for a name
            rendered = render(replace(inputs, keep_revision=kept))
    except RenderError as exc:
        return failed(obs, "InvalidSpec", str(exc))
    serving = serving_status(spec, rendered.revision, obs.child, obs.pods)
    if obs.child is None:
        serving["reason"] = "RollingOut"  # its Deployment is applied right after this status is written
    notes = [{"reason": reason, "message": message} for reason, message in rendered.notes]
    serving_reason, serving_message = (
        serving["reason"],
        serving.get("problem") or _revision_words(rendered.revision, notes),
    )
    ready = serving["ready"]
    status = merge_status(
        obs.status, gen,
        make_condition(gen, "Audited", True, "AuditPassed",
              f"{_what(ck)} passed {len(report.findings)} finding(s) without errors" if report.findings
              else f"{_what(ck)} passed the audit"),
        verifier_cond,
        draft_cond,
        make_condition(gen, "Serving", ready, serving_reason, serving_message),
        make_condition(gen, "Ready", ready, "Ready" if ready else "RollingOut",
              f"{serving['readyReplicas']}/{serving['replicas']} replicas of revision {rendered.revision} ready"),
        phase="Ready" if ready else "Deploying",
        revision=rendered.revision,
        renderNotes=notes or None,
        numSpeculativeTokens=num_speculative_tokens(spec, draft, tuned),
        replicas=serving["replicas"],
        readyReplicas=serving["readyReplicas"],
        updatedReplicas=serving["updatedReplicas"],
        **common,
    )  # fmt: skip
    image = served_image(rendered.revision, obs.pods) if ready and obs.pods else None
    if image is not None:
        status["servedImage"] = image
    events = []
    if obs.status.get("revision") != rendered.revision:
        events.append(("Normal", "RollingOut", f"applying revision {rendered.revision}"))
    return Plan(rendered.children, status, events)


def refresh_serving(
    spec: SpeculatorDeploymentSpec,
    status: dict[str, Any],
    child: dict[str, Any] | None,
    generation: int,
    pods: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The status after the child Deployment (or one of its pods) changed (no new audit, no new render).
    `updatedReplicas` alone moving is not worth a write: it is carried by the next change of readiness
    (a rollout costs a write per ready count, not one more per pod created)."""
    if status.get("phase") not in ("Deploying", "Ready") or not status.get("revision"):
        return status
    serving = serving_status(spec, status["revision"], child, pods)
    ready = serving["ready"]
    replicas = f"{serving['readyReplicas']}/{serving['replicas']} replicas of revision {status['revision']} ready"
    said = _revision_words(status["revision"], status.get("renderNotes") or [])
    new = merge_status(
        status, generation,
        make_condition(generation, "Serving", ready, serving["reason"], serving.get("problem") or said),
        make_condition(generation, "Ready", ready, "Ready" if ready else "RollingOut",
                       replicas + (f"; {serving['problem']}" if serving.get("problem") else "")),
        phase="Ready" if ready else "Deploying",
        replicas=serving["replicas"],
        readyReplicas=serving["readyReplicas"],
        updatedReplicas=serving["updatedReplicas"],
    )  # fmt: skip
    if ready and pods:
        image = served_image(status["revision"], pods)
        if image is not None:
            new["servedImage"] = image
    if _without(new, "updatedReplicas") == _without(status, "updatedReplicas"):
        return status
    return new


def _revision_words(revision: str, notes: list[dict[str, Any]]) -> str:
    """The Serving condition's message while nothing is wrong: the revision and the render's notes."""
    return "; ".join([f"revision {revision}", *(f"{n.get('reason')}: {n.get('message')}" for n in notes)])


def _without(status: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != key}


def needs_pods(status: dict[str, Any]) -> bool:
    """Whether the pods are worth reading: only while a revision is rolling out (a Ready resource costs
    no reads)."""
    return status.get("phase") == "Deploying"


def verifier_change(
    spec: SpeculatorDeploymentSpec, status: dict[str, Any], resolved: str | None, generation: int
) -> tuple[InputAction, dict[str, Any] | None]:
    """What a newly resolved verifier revision means: (the action, the status to write if any).

    Redeploy re-audits the draft against the new verifier and rolls both out together (or keeps the
    last good pair serving if the audit fails); Pause and Retrain only report VerifierCurrent=False.
    """
    old = status.get("verifierRevision")
    if resolved is None or old is None or resolved == old:
        return InputAction.NONE, None
    policy = spec.upgrade_policy.on_verifier_change
    if policy == "Redeploy":
        return InputAction.REDEPLOY, None
    if policy == "Pause":
        reason, message = (
            VerifierReason.CHANGED,
            f"the verifier moved from {old} to {resolved}; upgradePolicy is Pause: nothing is rolled out",
        )
        return InputAction.PAUSE, merge_status(
            status, generation, make_condition(generation, "VerifierCurrent", False, reason, message)
        )
    return InputAction.RETRAIN, None


@dataclass
class DraftChange:
    """What a newly resolved draft revision means under upgradePolicy.onDraftChange."""

    action: InputAction
    status: dict[str, Any] | None = None  # the status to write (pause)
    events: list[tuple[str, str, str]] = field(default_factory=list)


def draft_change(
    spec: SpeculatorDeploymentSpec, status: dict[str, Any], resolved: str | None, generation: int
) -> DraftChange:
    """The draft's bytes moved under the same source (a file replaced in place, a pointer moved to a new
    publish). Redeploy: audit the new draft and roll the pair out together. Pause: DraftCurrent=False and
    nothing moves; a replica of the old revision that restarts then finds its audited bytes gone (unless
    the old location is immutable) and refuses to start rather than serve what was not audited.
    Retrain means nothing here: a new draft needs no new training."""
    old = status.get("draftRevision")
    if resolved is None or old is None or resolved == old:
        return DraftChange(InputAction.NONE)
    source = spec.speculator.source or status.get("draftSource")
    message = f"the draft at {source} moved from {old} to {resolved}"
    verifier = condition(status.get("conditions") or [], "VerifierCurrent") or {}
    verifier_paused = verifier.get("reason") == VerifierReason.CHANGED  # a roll-out would move the verifier too
    if spec.upgrade_policy.on_draft_change == "Redeploy" and not verifier_paused:
        return DraftChange(
            InputAction.REDEPLOY, None, [("Normal", "DraftChanged", f"{message}; auditing it to roll it out")]
        )
    why = "the verifier change is paused too" if verifier_paused else "onDraftChange is Pause"
    message += (
        f"; {why}: nothing is rolled out, and replicas that restart cannot stage the audited bytes unless they "
        "are still where they were"
    )
    paused = merge_status(
        status, generation, make_condition(generation, "DraftCurrent", False, "DraftChanged", message)
    )
    events = [] if paused == status else [("Warning", "DraftChanged", message)]
    return DraftChange(InputAction.PAUSE, paused, events)


def retrain_name(name: str, revision: str) -> str:
    """The SpeculatorTrainJob that retrains `name` for a verifier revision (one per revision)."""
    tag = re.sub(r"[^a-z0-9]", "", revision.lower().split(":")[-1])[:10] or "rev"
    return f"{name[: 63 - len(tag) - 9]}-retrain-{tag}"


def retrain_job(
    name: str, namespace: str, uid: str | None, spec: SpeculatorDeploymentSpec, revision: str
) -> dict[str, Any]:
    """The SpeculatorTrainJob for the new verifier revision from upgradePolicy.trainTemplate; ValueError
    names what is wrong with the template."""
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
    try:
        SpeculatorTrainJobSpec.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"upgradePolicy.trainTemplate.{where}: {first['msg']}") from None
    meta: dict[str, Any] = {"name": retrain_name(name, revision), "namespace": namespace,
                            "labels": {RETRAINS_LABEL: name}}  # fmt: skip
    if uid:
        meta["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "SpeculatorDeployment", "name": name,
                                    "uid": uid, "controller": False, "blockOwnerDeletion": False}]  # fmt: skip
    return {"apiVersion": API_VERSION, "kind": "SpeculatorTrainJob", "metadata": meta, "spec": body}


def retrain_status(status: dict[str, Any], generation: int, job: str | None, revision: str,
                   error: str | None) -> dict[str, Any]:  # fmt: skip
    """VerifierCurrent=False while a retraining runs (or why it could not start); the pair keeps serving."""
    old = status.get("verifierRevision")
    if job is None:
        message = f"the verifier moved from {old} to {revision}; no retraining: {error}; the current pair keeps serving"
        return merge_status(
            status,
            generation,
            make_condition(generation, "VerifierCurrent", False, VerifierReason.RETRAIN_UNAVAILABLE, message),
        )
    message = (f"the verifier moved from {old} to {revision}; SpeculatorTrainJob {job} trains a draft for it; "
               "the current pair keeps serving until the new draft passes its audit")  # fmt: skip
    retraining = make_condition(generation, "VerifierCurrent", False, VerifierReason.RETRAINING, message)
    return merge_status(status, generation, retraining, retrain={"job": job, "verifierRevision": revision})


def train_job_output(stj: dict[str, Any] | None, job: str, verifier_model: str) -> tuple[str, str | None] | Problem:
    """(checkpoint uri, credentials Secret) of the SpeculatorTrainJob `job` once it has succeeded (the stored
    object, None if it does not exist), or why it cannot be served yet."""
    if stj is None:
        return Problem("TrainJobPending", f"SpeculatorTrainJob {job!r} does not exist (yet)")
    spec, status = stj.get("spec") or {}, stj.get("status") or {}
    trained_for = (spec.get("verifier") or {}).get("model")
    if trained_for != verifier_model:
        return Problem("TrainJobMismatch", f"SpeculatorTrainJob {job!r} trains for verifier {trained_for!r}, "
                       f"this deployment serves {verifier_model!r}")  # fmt: skip
    phase = status.get("phase") or "Pending"
    if phase == "Failed":
        return Problem("TrainJobFailed", f"SpeculatorTrainJob {job!r} failed at stage {status.get('stage')}")
    uri = (status.get("checkpoint") or {}).get("uri")
    if phase != "Succeeded" or not uri:
        stage = f" (stage {status['stage']})" if status.get("stage") else ""
        return Problem("TrainJobPending", f"SpeculatorTrainJob {job!r} is {phase}{stage}")
    return uri, ((spec.get("output") or {}).get("credentials") or {}).get("name")


def holds_for_retrain(status: dict[str, Any], generation: int) -> bool:
    """A retraining is in flight and nothing was asked since: the pair stays pinned to its old verifier
    (a resumed operator must not move it to the new revision with the old draft)."""
    return bool(status.get("retrain")) and status.get("observedGeneration") == generation


def retrain_due(spec: SpeculatorDeploymentSpec, action: InputAction, status: dict[str, Any], revision: str) -> bool:
    """Whether a new verifier revision starts a retraining: Retrain always (once per revision); Redeploy
    when the draft failed its audit against it (Degraded) and a train template is given."""
    if (status.get("retrain") or {}).get("verifierRevision") == revision:
        return False
    if action == InputAction.RETRAIN:
        return True
    return (
        action == InputAction.REDEPLOY
        and status.get("phase") == "Degraded"
        and bool(spec.upgrade_policy.train_template)
    )


def adopt_retrain(previous: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
    """The planned status, without `retrain` once the retrained pair is the one being rolled out."""
    retrain = previous.get("retrain") or {}
    if (
        retrain
        and planned.get("phase") in ("Deploying", "Ready")
        and (planned.get("verifierRevision") == retrain.get("verifierRevision"))
    ):
        return {k: v for k, v in planned.items() if k != "retrain"}
    return planned


def apply_failed(status: dict[str, Any], generation: int, message: str) -> dict[str, Any]:
    """The status when the API server refused a child: not serving, with its words; retried."""
    return merge_status(
        status, generation,
        make_condition(generation, "Serving", False, "ApplyFailed", message),
        make_condition(generation, "Ready", False, "ApplyFailed", message),
        phase="Degraded" if status.get("readyReplicas") else "Deploying",
    )  # fmt: skip
