"""Every watch and periodic job of both kinds, declared in one place (as a controller-runtime controller's
SetupWithManager does): what each kopf event, index and periodic tick enqueues, with which cause and priority.
Each handler here only tells an event apart and enqueues a key (or keeps what the event showed for the pass);
the passes are controllers/deployment.py and controllers/trainjob.py, each registered with its work queue below.

The order of the declarations is the order kopf and the scheduler run them in for one event or tick."""

from __future__ import annotations

import time
from typing import Any

import kopf

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.api.labels import DEPLOYMENT_LABEL, MANAGED_BY_LABEL, TRACK_LABEL
from speculator_operator.controllers import deployment, drift, observed, telemetry, trainjob
from speculator_operator.controllers.queues import DEPLOYMENTS, TRAINJOBS
from speculator_operator.planning import progress, requests
from speculator_operator.planning.passes import READINESS_PRIORITY, Cause
from speculator_operator.planning.pods import pod_problem
from speculator_operator.planning.trainjob import resync_due, wakes_owner
from speculator_operator.render.serving import MANAGED_BY
from speculator_operator.runtime import metrics
from speculator_operator.runtime import scheduler as periodic
from speculator_operator.runtime.kube import RESYNC_SECONDS

# the serving pods (one index: the serving counts and the acceptance scrape read it) and the scrape loop
kopf.index("", "v1", "pods", labels=observed.SERVING)(observed.serving_pods)  # type: ignore[arg-type]
kopf.on.cleanup()(telemetry.close_session)
kopf.on.startup()(telemetry.keep_index)
periodic.on_gone(telemetry.PLURAL)(telemetry.deployment_gone)
periodic.every(telemetry.PLURAL, interval=telemetry.SCRAPE_INTERVAL, initial=telemetry.SCRAPE_INTERVAL / 2)(
    telemetry.scrape_acceptance
)

# --- SpeculatorDeployment -----------------------------------------------------------------------------------
PLURAL, TRAIN_JOBS = deployment.PLURAL, deployment.TRAIN_JOBS
DEPLOYMENTS.handles(deployment.run_pass)
periodic.controlled(PLURAL, DEPLOYMENTS)

_polled: dict[str, float] = {}  # uid -> when its inputs were last resolved (monotonic)
metrics.tracked("deployment.polled", lambda: len(_polled))


@periodic.every(PLURAL, interval=deployment.POLL_TICK_SECONDS)
async def poll_inputs(body: kopf.Body) -> None:
    """Every upgradePolicy.pollIntervalSeconds: the object is enqueued with the cause "poll" (its pass resolves
    the revisions). The tick itself stays on the event loop."""
    parsed = deployment.parsed_spec(body.spec)
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
    DEPLOYMENTS.enqueue(namespace, meta["name"], Cause.POLL)


@periodic.on_gone(PLURAL)
def _forget_deployment(namespace: str, name: str, uid: str) -> None:
    _polled.pop(uid, None)
    drift.forget((namespace, name))
    observed.forget((namespace, name))


@kopf.on.startup()
def _fresh(**_: Any) -> None:
    _polled.clear()
    deployment.forget_offers()
    drift.clear()
    observed.clear()


@kopf.index(GROUP, VERSION, PLURAL)
async def fed_by(*, namespace: str | None, name: str | None, spec: kopf.Spec, status: kopf.Status,
                 **_: Any) -> dict[Any, Any]:  # fmt: skip
    """(namespace, train job) -> the deployments serving its output (speculator.fromTrainJob) and the draft each
    serves now: a train job's event finds them without a read."""
    job = (spec.get("speculator") or {}).get("fromTrainJob")
    return {(namespace, job): (name, status.get("draftSource"))} if job else {}


@kopf.index(GROUP, VERSION, PLURAL)
async def handed_to(*, namespace: str | None, name: str | None, status: kopf.Status, **_: Any) -> dict[Any, Any]:
    """(namespace, deployment) -> the (train job, location) handed over to it: a train job's event that offers what
    is served already enqueues nothing."""
    handed = status.get("handedOver") or {}
    return {(namespace, name): (handed.get("trainJob"), handed.get("uri"))} if handed else {}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def requested(*, body: kopf.Body, namespace: str | None, type: str | None, **_: Any) -> None:
    """A request annotation with a value not yet acted on (planning/requests.py): the object is enqueued with the
    cause "request". Told apart in the event loop: the pass records the value, so its own write enqueues nothing."""
    if namespace is None or type == "DELETED":
        return
    meta = body.get("metadata") or {}
    if requests.pending(meta.get("annotations"), (body.get("status") or {}).get("requests")):
        DEPLOYMENTS.enqueue(namespace, str(meta.get("name") or ""), Cause.REQUEST)


@kopf.on.event(GROUP, VERSION, TRAIN_JOBS)
async def train_job_changed(*, body: kopf.Body, namespace: str | None, type: str | None, **kwargs: Any) -> None:
    """A train job finished: the deployments serving its output (speculator.fromTrainJob) and the one its
    spec.deployTo names move now (enqueued with the cause "trainjob"), unless one serves that output already.
    Told apart in the event loop."""
    status = body.get("status") or {}
    phase = status.get("phase")
    if namespace is None:
        return
    offered = deployment.hold_offer(body, namespace, type)
    job = str(body.get("metadata", {}).get("name") or "")
    if offered is not None:
        target, offered_uri = offered
        handed: kopf.Index[Any, Any] = kwargs["handed_to"]
        if (job, offered_uri) not in list(handed.get((namespace, target), [])):
            DEPLOYMENTS.enqueue(namespace, target, Cause.TRAINJOB)
    if phase not in ("Succeeded", "Failed"):
        return
    uri = (status.get("checkpoint") or {}).get("uri")
    index: kopf.Index[Any, Any] = kwargs["fed_by"]
    for owner, serving in index.get((namespace, body.get("metadata", {}).get("name")), []):
        if phase == "Succeeded" and serving == uri:
            continue  # already serving it
        DEPLOYMENTS.enqueue(namespace, owner, Cause.TRAINJOB)


_serving = observed.SERVING


@kopf.on.event("apps", "v1", "deployments", labels=_serving)  # type: ignore[arg-type]
async def child_changed(*, body: kopf.Body, namespace: str | None, type: str, **kwargs: Any) -> None:
    """A child Deployment moved: its owner is enqueued (replica counts, readiness; ahead of the other quick passes
    when its ready count moved), with the child and its pods as watched held for the pass, unless nothing the
    counts read changed; deleted or changed by hand, with
    that held for the pass, which restores it."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if not owner or not type or namespace is None:
        return
    drifted = drift.hold(body, namespace, owner, type)
    changed = observed.moved(body, type)
    if drifted:
        observed.forget((namespace, owner))  # its pass reads the child itself: one held before may be gone
        DEPLOYMENTS.enqueue(namespace, owner, Cause.DRIFT)
    elif changed:
        # a canary's Deployment is not the serving workload the counts read: its pods are held, the child is not
        main = TRACK_LABEL not in ((body.get("metadata") or {}).get("labels") or {})
        observed.hold((namespace, owner), observed.pods(kwargs, (namespace, owner)), child=body if main else None)
        first = READINESS_PRIORITY if changed is observed.Moved.READINESS else 0
        DEPLOYMENTS.enqueue(namespace, owner, Cause.CHILD, first)


@kopf.on.event("", "v1", "services", labels=_serving)  # type: ignore[arg-type]
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_serving)  # type: ignore[arg-type]
async def other_child_changed(*, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    """A child Service or PodDisruptionBudget deleted or changed by hand: its owner restores it."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if owner and namespace is not None and type and drift.hold(body, namespace, owner, type):
        DEPLOYMENTS.enqueue(namespace, owner, Cause.DRIFT)


@kopf.on.event("", "v1", "pods", labels=_serving)  # type: ignore[arg-type]
async def pod_changed(*, body: kopf.Body, namespace: str | None, type: str, **kwargs: Any) -> None:
    """A serving pod got stuck (an image the node cannot get, a crash loop, no node for it): its owner says
    so (the pods as watched held for its pass). Other pod events change nothing the Deployment's own status
    does not already say."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if owner and namespace is not None and type != "DELETED" and pod_problem(dict(body)) is not None:
        observed.hold((namespace, owner), observed.pods(kwargs, (namespace, owner)))
        DEPLOYMENTS.enqueue(namespace, owner, Cause.CHILD)


@periodic.every(PLURAL, interval=RESYNC_SECONDS, idle=RESYNC_SECONDS / 2)
async def resync(body: kopf.Body) -> None:
    """A missed child event must not leave the status stale: the object is compared with its child now and
    then, by a pass that writes only when something differs."""
    meta = body.get("metadata", {})
    if meta.get("namespace"):
        DEPLOYMENTS.enqueue(meta["namespace"], meta["name"], Cause.RESYNC)


# --- SpeculatorTrainJob -------------------------------------------------------------------------------------
TRAINJOBS.handles(trainjob.run_pass)
periodic.controlled(trainjob.PLURAL, TRAINJOBS)
LABEL = trainjob.LABEL


async def _owner_event(body: kopf.Body, namespace: str | None, type: str | None, **_: Any) -> None:
    """A stage Job finished or a server became available (or one went away): the owner's key is enqueued, in
    the event loop. Other child events (pods starting, counters) change nothing the stage machine decides on."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(LABEL)
    if owner and namespace and wakes_owner(type, dict(body)):
        TRAINJOBS.enqueue(namespace, owner, Cause.CHILD)


async def _pod_event(body: kopf.Body, namespace: str | None, type: str | None, **_: Any) -> None:
    """A stage pod got stuck (an image the node cannot get, a crash loop): the run says so."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(LABEL)
    if owner and namespace and type != "DELETED" and pod_problem(dict(body)) is not None:
        TRAINJOBS.enqueue(namespace, owner, Cause.CHILD)


_stages = {"labels": {MANAGED_BY_LABEL: MANAGED_BY, LABEL: kopf.PRESENT}}
kopf.on.event("batch", "v1", "jobs", **_stages)(_owner_event)  # type: ignore[arg-type]
kopf.on.event("apps", "v1", "deployments", **_stages)(_owner_event)  # type: ignore[arg-type]
kopf.on.event("", "v1", "pods", **_stages)(_pod_event)  # type: ignore[arg-type]


@periodic.every(trainjob.PLURAL, interval=RESYNC_SECONDS, idle=RESYNC_SECONDS / 2)
async def resync_run(body: kopf.Body) -> None:
    """A missed child event must not stall a run; a missing hand-off target may appear later."""
    if resync_due(dict(body.get("spec") or {}), dict(body.get("status") or {})):
        meta = body.get("metadata", {})
        TRAINJOBS.enqueue(meta["namespace"], meta["name"], Cause.RESYNC)


@periodic.every(trainjob.PLURAL, interval=trainjob.PROGRESS_SECONDS)
async def watch_progress(body: kopf.Body) -> None:
    """A running stage's live progress: read in the periodic lane (a log read never holds up a pass), held,
    and the object enqueued when it says something new: at most one status write per PROGRESS_SECONDS."""
    if progress.reading_due(dict(body.get("status") or {})):
        await periodic.in_lane(trainjob.read_progress, dict(body))


@periodic.on_gone(trainjob.PLURAL)
def _forget_run(namespace: str, name: str, uid: str) -> None:
    trainjob.forget(namespace, name)
