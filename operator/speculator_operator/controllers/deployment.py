"""kopf handlers for SpeculatorDeployment: read -> plan -> apply -> status. No decisions live here."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.labels import DEPLOYMENT_LABEL, MANAGED_BY_LABEL
from speculator_operator.domain.checkpoint import (
    CheckpointError,
    SourceError,
    audit,
    load_served,
    open_source,
    read_verifier,
)
from speculator_operator.domain.economics import pair_cost_ratio
from speculator_operator.domain.releases import get_release
from speculator_operator.planning import Problem, parse_spec
from speculator_operator.planning.deployment import (
    Observed,
    Plan,
    adopt_retrain,
    apply_failed,
    draft_change,
    failed,
    holds_for_retrain,
    needs_pods,
    plan,
    refresh_serving,
    retrain_due,
    retrain_job,
    retrain_status,
    train_job_output,
    verifier_change,
)
from speculator_operator.planning.drift import edited_by, fingerprint
from speculator_operator.planning.pods import pod_problem
from speculator_operator.render.serving import MANAGED_BY
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import scheduler as periodic
from speculator_operator.runtime.kube import (
    FIELD_MANAGER,
    RESYNC_SECONDS,
    RETRY_SECONDS,
    CredentialsError,
    api_message,
    apply_children,
    current_child,
    in_child_lane,
    list_pods,
    namespace_terminating,
    read_child,
    secret_data,
)

PLURAL = "speculatordeployments"
TRAIN_JOBS = "speculatortrainjobs"
POLL_TICK_SECONDS = float(os.environ.get("SPECULATOR_POLL_TICK_SECONDS", "10"))
log = logging.getLogger(__name__)


def read_train_job(namespace: str, job: str) -> dict[str, Any] | None:
    return kube.read_custom(TRAIN_JOBS, namespace, job)


def _draft_location(spec: SpeculatorDeploymentSpec, namespace: str) -> tuple[str, str | None, bool] | Problem:
    """(where the draft is read, its credentials Secret, whether it is a train job's output) or why not yet."""
    if spec.speculator.from_train_job:
        job = spec.speculator.from_train_job
        found = train_job_output(read_train_job(namespace, job), job, spec.verifier.model)
        if isinstance(found, Problem):
            return found
        return found[0], found[1], True
    secret = spec.speculator.credentials.name if spec.speculator.credentials else None
    return spec.speculator.source or "", secret, False


def _observe_inputs(
    name: str, namespace: str, spec: SpeculatorDeploymentSpec, generation: int, status: dict[str, Any]
) -> Observed:
    obs = Observed(generation=generation, status=status, child=current_child(namespace, name))
    if obs.child is not None and needs_pods(status):
        obs.pods = deployment_pods(namespace, name)
    located = _draft_location(spec, namespace)
    if isinstance(located, Problem):
        obs.problem = (located.reason, located.message)
        return obs
    source, draft_secret, from_job = located
    if from_job:
        obs.draft_source = source
    try:
        verifier_creds = secret_data(namespace, spec.verifier.credentials.name if spec.verifier.credentials else None)
        draft_creds = secret_data(namespace, draft_secret)
    except CredentialsError as exc:
        obs.problem = ("CredentialsUnreadable", str(exc))
        return obs
    location = spec.verifier.config_location
    verifier = None
    if location is not None:
        try:
            ref = read_verifier(location, verifier_creds)
        except CheckpointError as exc:
            obs.problem = ("VerifierUnreadable", str(exc))
            return obs
        verifier, obs.verifier_revision, obs.verifier_content = ref.config, ref.revision, ref.content
        if spec.verifier.model.startswith("s3://"):
            obs.verifier_manifest = ref.manifest  # the files its pods stage
    else:
        obs.verifier_revision = spec.verifier.revision  # a pvc:// verifier is read by the pods, which mount it
    release = get_release(spec.release)
    try:
        ck = load_served(source, draft_creds)
    except CheckpointError as exc:
        obs.problem = ("CheckpointUnreadable", str(exc))
        return obs
    if ck.resolved_from:
        obs.draft_source = ck.uri  # the exact location a pointer led to: what the pods stage
    if verifier is not None:
        obs.cost_ratio = pair_cost_ratio(ck.drafting_shapes, verifier)
    obs.audit = audit(
        ck,
        verifier=verifier,
        served_verifier=spec.verifier.uri,
        verifier_revision=obs.verifier_revision if location is not None else None,
        verifier_content=obs.verifier_content,
        release=release,
        allow_lossy=spec.audit.allow_lossy,
        speculative_tokens=None
        if spec.serving.num_speculative_tokens == "auto"
        else int(spec.serving.num_speculative_tokens),
    )
    metrics.audited("SpeculatorDeployment", obs.audit)
    return obs


def write_status(namespace: str, name: str, old: dict[str, Any], new: dict[str, Any], cause: str) -> None:
    kube.write_status(PLURAL, namespace, name, old, new, cause)


def deployment_pods(namespace: str, name: str) -> list[dict[str, Any]]:
    return list_pods(namespace, f"{DEPLOYMENT_LABEL}={name}")


def _post(body: kopf.Body, p: Plan) -> None:
    for type_, reason, message in p.events:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])


def reconcile_status(
    body: kopf.Body,
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any] | None,
    name: str,
    namespace: str,
    uid: str,
    restoring: str | None = None,
    cause: str = "reconcile",
) -> Plan:
    """Observe, plan, write the status, apply the children, post the events: one reconcile of a
    SpeculatorDeployment whose stored status is `status` (also the tuning loop's way to roll a revision).
    `restoring` (why) re-applies children whose rendered form did not change: one was changed by hand; a
    ChildRestored event says so when that changed something. `cause` labels its status writes."""
    current = dict(status or {})
    generation = int(meta.get("generation") or 0)
    parsed = parse_spec(SpeculatorDeploymentSpec, spec)
    if isinstance(parsed, Problem):
        p = failed(Observed(generation=generation, status=current), parsed.reason, parsed.message)
    else:
        obs = _observe_inputs(name, namespace, parsed[0], generation, current)
        p = plan(name, namespace, uid, parsed[0], parsed[1], obs)
    p.status = adopt_retrain(current, p.status)
    # status first: the child's events may arrive before this handler returns, and they are
    # interpreted against the revision recorded here
    write_status(namespace, name, current, p.status, cause)
    if p.children:
        try:
            changed = apply_children(p.children, force=restoring is not None)
            if restoring and changed:
                log.info("%s/%s: %s; restored", namespace, name, restoring)
                kopf.event(body, type="Normal", reason="ChildRestored", message=f"{restoring}; restored"[:1024])
        except ApiException as exc:
            if namespace_terminating(exc):
                log.info("%s/%s: not applied, the namespace is being deleted", namespace, name)
                return p
            message = f"applying the children failed: {exc.status} {exc.reason}: {api_message(exc)}"
            failed_apply = apply_failed(p.status, int(meta.get("generation") or 0), message)
            write_status(namespace, name, p.status, failed_apply, cause)
            kopf.event(body, type="Warning", reason="ApplyFailed", message=message[:1024])
            raise kopf.TemporaryError(message, delay=RETRY_SECONDS) from None
    _post(body, p)
    return p


@periodic.reconciler(PLURAL)
def reconcile(body: kopf.Body) -> None:
    """Each generation once (and each object when the operator starts), retried while inputs are missing."""
    meta, namespace, name = body.meta, body.get("metadata", {}).get("namespace"), body.get("metadata", {}).get("name")
    assert namespace is not None  # the CRD is namespaced
    current = dict(body.status or {})
    if holds_for_retrain(current, int(meta.get("generation") or 0)):
        return
    with metrics.reconciling("SpeculatorDeployment"):
        p = reconcile_status(body, body.spec, meta, body.status, name, namespace, meta["uid"])
        if p.status.get("phase") == "Pending":
            # an input could not be read: try again later (the status above says which and why)
            raise kopf.TemporaryError("waiting for inputs; see status.conditions", delay=RETRY_SECONDS)


def parsed_spec(spec: Mapping[str, Any]) -> SpeculatorDeploymentSpec | None:
    """The typed spec, or None when it does not validate (the create/update handler reports that)."""
    try:
        return SpeculatorDeploymentSpec.model_validate(dict(spec))
    except ValidationError:
        return None


def resolve_verifier_revision(spec: SpeculatorDeploymentSpec, namespace: str) -> str | None:
    """The verifier's revision now: the hub commit of spec.verifier.revision, or the digest of its s3 files."""
    location = spec.verifier.config_location
    if location is None:
        return None
    creds = secret_data(namespace, spec.verifier.credentials.name if spec.verifier.credentials else None)
    return read_verifier(location, creds).revision


def resolve_draft_revision(spec: SpeculatorDeploymentSpec, namespace: str) -> str | None:
    """The draft's revision now (a listing or a model_info call, no download), or None if it cannot be said."""
    located = _draft_location(spec, namespace)
    if isinstance(located, Problem) or located[0].startswith("pvc://"):
        return None
    source, secret, _ = located
    try:
        return open_source(source, secret_data(namespace, secret), kind="draft").revision
    except SourceError as exc:
        raise CheckpointError(str(exc)) from None


_polled: dict[str, float] = {}  # uid -> when its inputs were last resolved (monotonic)
metrics.tracked("deployment.polled", lambda: len(_polled))


@periodic.every(PLURAL, interval=POLL_TICK_SECONDS)
async def poll_inputs(body: kopf.Body) -> None:
    """Every upgradePolicy.pollIntervalSeconds: resolve the verifier and the draft revisions again and act on
    a change (onVerifierChange, onDraftChange). The tick itself stays on the event loop: a thread only
    when a poll is due."""
    parsed = parsed_spec(body.spec)
    meta = body.get("metadata", {})
    namespace, uid = meta.get("namespace"), meta["uid"]
    if namespace is None or parsed is None:
        return
    now = time.monotonic()
    last = _polled.get(uid)
    if last is not None and now - last < parsed.upgrade_policy.poll_interval_seconds:
        return
    _polled[uid] = now
    if last is None:
        return  # the first reconcile has just resolved them
    await periodic.in_lane(_poll_inputs, body, body.spec, body.meta, body.status, meta["name"], namespace, uid, parsed)


@periodic.on_gone(PLURAL)
def _forget(namespace: str, name: str, uid: str) -> None:
    _polled.pop(uid, None)


@kopf.on.startup()
def _fresh(**_: Any) -> None:
    _polled.clear()


def _poll_inputs(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    name: str,
    namespace: str,
    uid: str,
    parsed: SpeculatorDeploymentSpec,
) -> None:
    current = dict(status or {})
    generation = int(meta.get("generation") or 0)
    try:
        resolved = resolve_verifier_revision(parsed, namespace)
    except (CheckpointError, CredentialsError) as exc:
        log.warning("%s/%s: verifier revision not resolved: %s", namespace, name, exc)
        return
    action, new_status = verifier_change(parsed, current, resolved, generation)
    if action == "redeploy":
        p = reconcile_status(body, spec, meta, status, name, namespace, uid, cause="poll")
        if resolved and retrain_due(parsed, action, p.status, resolved):
            start_retrain(body, parsed, p.status, name, namespace, uid, resolved, generation)
        return
    if action == "retrain" and resolved:
        if retrain_due(parsed, action, current, resolved):
            start_retrain(body, parsed, current, name, namespace, uid, resolved, generation)
        return
    if new_status is not None:
        write_status(namespace, name, current, new_status, "poll")
        current = new_status
    if holds_for_retrain(current, generation):
        return  # the pair is pinned until the retrained draft is handed over
    try:
        draft = resolve_draft_revision(parsed, namespace)
    except (CheckpointError, CredentialsError) as exc:
        log.warning("%s/%s: draft revision not resolved: %s", namespace, name, exc)
        return
    change = draft_change(parsed, current, draft, generation)
    for type_, reason, message in change.events:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])
    if change.action == "redeploy":
        reconcile_status(body, spec, meta, status, name, namespace, uid, cause="poll")
    elif change.status is not None:
        write_status(namespace, name, current, change.status, "poll")


def start_retrain(body: kopf.Body, spec: SpeculatorDeploymentSpec, status: dict[str, Any], name: str,
                  namespace: str, uid: str, revision: str, generation: int) -> None:  # fmt: skip
    """Create the SpeculatorTrainJob for the new verifier revision (once: its name is per revision)."""
    try:
        manifest = retrain_job(name, namespace, uid, spec, revision)
    except ValueError as exc:
        write_status(namespace, name, status, retrain_status(status, generation, None, revision, str(exc)), "retrain")
        kopf.event(body, type="Warning", reason="RetrainUnavailable", message=str(exc)[:1024])
        return
    job = manifest["metadata"]["name"]
    try:
        kube.create_custom(TRAIN_JOBS, namespace, manifest)
        message = f"SpeculatorTrainJob {job} for verifier {revision}"
        kopf.event(body, type="Normal", reason="Retraining", message=message)
    except ApiException as exc:
        if exc.status != 409:  # 409: created before (a restart, or the last poll)
            raise
    write_status(namespace, name, status, retrain_status(status, generation, job, revision, None), "retrain")


@kopf.on.event(GROUP, VERSION, TRAIN_JOBS)
async def train_job_changed(*, body: kopf.Body, namespace: str | None, **_: Any) -> None:
    """A train job finished: the deployments serving its output (speculator.fromTrainJob) move now. Any
    other event is told apart in the event loop (a plain function would wait for a thread to find that)."""
    phase = (body.get("status") or {}).get("phase")
    if namespace is None or phase not in ("Succeeded", "Failed"):
        return
    await in_child_lane(_train_job_finished, body, namespace, phase)


def _train_job_finished(body: kopf.Body, namespace: str, phase: str) -> None:
    job = body.get("metadata", {}).get("name")
    for item in kube.list_custom(PLURAL, namespace):
        if ((item.get("spec") or {}).get("speculator") or {}).get("fromTrainJob") != job:
            continue
        if phase == "Succeeded" and (item.get("status") or {}).get("draftSource") == (
            (body.get("status") or {}).get("checkpoint") or {}
        ).get("uri"):
            continue  # already serving it
        obj = kopf.Body(cast(kopf.RawBody, item))
        meta = item["metadata"]
        reconcile_status(obj, obj.spec, obj.meta, obj.status, meta["name"], namespace, meta["uid"], cause="trainjob")


def refresh_owner(namespace: str, owner: str, child: dict[str, Any] | None) -> None:
    """Refresh the owner's replica counts and readiness from its child Deployment (and, while it rolls
    out, the pods' own words)."""
    parent = kube.read_custom(PLURAL, namespace, owner)
    if parent is None:
        return
    try:
        parsed = SpeculatorDeploymentSpec.model_validate(parent.get("spec") or {})
    except ValidationError:
        return
    status = dict(parent.get("status") or {})
    pods = None
    if needs_pods(status):
        # while it rolls out, a stuck pod's own words; once rolled out, the image the kubelet runs (one read
        # per rollout: a Ready resource is not Deploying)
        pods = deployment_pods(namespace, owner)
    generation = int(parent["metadata"]["generation"])
    write_status(namespace, owner, status, refresh_serving(parsed, status, child, generation, pods), "child")


_children = {MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: kopf.PRESENT}
_serving_pods = _children


# children whose other managers own only what the operator does not set: {uid: drift.fingerprint}
_theirs: dict[str, str] = {}
metrics.tracked("deployment.drift", lambda: len(_theirs))


def restore(namespace: str, owner: str, child: dict[str, Any] | None, what: str) -> bool:
    """A child was deleted or changed by hand (`what` says which and by whom): reconcile its owner,
    re-applying every child. False when there is no owner to restore for (it is being deleted)."""
    raw = kube.read_custom(PLURAL, namespace, owner)
    if raw is None:
        return False
    obj = kopf.Body(cast(kopf.RawBody, raw))
    if obj.meta.get("deletionTimestamp") or holds_for_retrain(dict(obj.status), int(obj.meta.get("generation") or 0)):
        return False
    with metrics.reconciling("SpeculatorDeployment"):
        reconcile_status(
            obj, obj.spec, obj.meta, obj.status, owner, namespace, obj.meta["uid"], restoring=what, cause="restore"
        )
    if child is not None:
        uid = child["metadata"]["uid"]
        now = read_child(child["apiVersion"], child["kind"], namespace, child["metadata"]["name"])
        if now is not None and edited_by(now, FIELD_MANAGER):
            _theirs[uid] = fingerprint(now, FIELD_MANAGER)  # what is left is theirs
    return True


def _drift(body: kopf.Body, type: str | None) -> tuple[dict[str, Any] | None, str] | None:
    """The child as it is now and why its owner should restore it (deleted, or its spec changed by someone
    else), or None. The event may be stale (one queued before the last restoration landed): the child as
    the API server has it now decides."""
    kind, name = body.get("kind") or "child", body.get("metadata", {}).get("name")
    if type == "DELETED":
        _theirs.pop(body.get("metadata", {}).get("uid") or "", None)
    elif not edited_by(body, FIELD_MANAGER):
        return None
    now = read_child(body.get("apiVersion") or "", kind, body.get("metadata", {}).get("namespace") or "", name)
    if now is None:
        return None, f"{kind} {name} was deleted"
    who = edited_by(now, FIELD_MANAGER)
    if who is None or _theirs.get(now["metadata"]["uid"]) == fingerprint(now, FIELD_MANAGER):
        return None
    return now, f"{kind} {name} was changed by {who}"


def _child_changed(body: kopf.Body, namespace: str, owner: str, type: str) -> None:
    drift = _drift(body, type)
    if drift and restore(namespace, owner, *drift):
        return
    refresh_owner(namespace, owner, None if type == "DELETED" else dict(body))


@kopf.on.event("apps", "v1", "deployments", labels=_children)  # type: ignore[arg-type]
async def child_changed(*, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    """A child Deployment moved: refresh the owner's replica counts and readiness; deleted or changed by
    hand: restore it. In the child-event pool, not behind the audits in kopf's."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if not owner or not type or namespace is None:
        return
    await in_child_lane(_child_changed, body, namespace, owner, type)


def _other_child_changed(body: kopf.Body, namespace: str, owner: str, type: str) -> None:
    drift = _drift(body, type)
    if drift:
        restore(namespace, owner, *drift)


@kopf.on.event("", "v1", "services", labels=_children)  # type: ignore[arg-type]
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_children)  # type: ignore[arg-type]
async def other_child_changed(*, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    """A child Service or PodDisruptionBudget deleted or changed by hand: restore it."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if owner and namespace is not None and (type == "DELETED" or edited_by(body, FIELD_MANAGER)):
        await in_child_lane(_other_child_changed, body, namespace, owner, type)


def _pod_changed(namespace: str, owner: str) -> None:
    refresh_owner(namespace, owner, current_child(namespace, owner))


@kopf.on.event("", "v1", "pods", labels=_serving_pods)  # type: ignore[arg-type]
async def pod_changed(*, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    """A serving pod got stuck (an image the node cannot get, a crash loop, no node for it): its owner says
    so. Other pod events change nothing the Deployment's own status does not already say."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if not owner or namespace is None or type == "DELETED" or pod_problem(dict(body)) is None:
        return
    await in_child_lane(_pod_changed, namespace, owner)


@periodic.every(PLURAL, interval=RESYNC_SECONDS, idle=RESYNC_SECONDS / 2)
async def resync(body: kopf.Body) -> None:
    """A missed child event must not leave the status stale: compare with the child now and then.
    Writes only when something differs."""
    await periodic.in_lane(_resync, body)


def _resync(body: kopf.Body) -> None:
    parsed = parsed_spec(body.spec)
    namespace, name = body.get("metadata", {}).get("namespace"), body.get("metadata", {}).get("name")
    if namespace is None or parsed is None:
        return
    current = dict(body.status or {})
    pods = deployment_pods(namespace, name) if needs_pods(current) else None
    generation = int(body.meta.get("generation") or 0)
    write_status(namespace, name, current, refresh_serving(parsed, current, current_child(namespace, name),
                                                           generation, pods), "resync")  # fmt: skip
