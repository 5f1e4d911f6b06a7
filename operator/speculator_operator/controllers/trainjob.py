"""The pass of a SpeculatorTrainJob: observe the stage Jobs, servers and pods -> plan -> execute -> status.

The stage machine lives in planning/trainjob.py. Here: read the verifier once (its revision and
layer count are then kept in status.provenance, so the run stays pinned), list the children by label,
read the reports the stage pods left as termination messages, have the executor (runtime/executor.py) apply
what the plan asks for (server-side apply, one field manager) and remove servers no stage needs, and hand the
published checkpoint to a SpeculatorDeployment. Its watches: controllers/watches.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from functools import partial
from typing import Any

from speculator_operator.adapters.checkpoints import read_verifier
from speculator_operator.api.common import evolve, stored
from speculator_operator.api.labels import STAGE_LABEL, TRAINJOB_LABEL
from speculator_operator.api.podcontract import parse_progress
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec, SpeculatorTrainJobStatus
from speculator_operator.controllers.queues import TRAINJOBS
from speculator_operator.controllers.retention import plan_prune, prune_failed
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.planning import Problem, parse_spec, progress
from speculator_operator.planning.health import trainjob_health
from speculator_operator.planning.passes import Cause, trainjob_progress_only
from speculator_operator.planning.pods import refused_creation
from speculator_operator.planning.stagepods import observe_pods
from speculator_operator.planning.trainjob import (
    HandOff,
    Observed,
    Plan,
    failed,
    handed_off,
    handoff_offer,
    job_state,
    plan,
    retained,
)
from speculator_operator.planning.writes import Apply, Delete, Writes, deletes
from speculator_operator.render import group
from speculator_operator.render.serving import RenderError
from speculator_operator.render.training import SERVER_ROLES, verifier_facts
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import settings as operator_settings
from speculator_operator.runtime.controller import PassStatus
from speculator_operator.runtime.executor import Executor, FoldersFailed, Refused, Terminating
from speculator_operator.runtime.inbox import Inbox
from speculator_operator.runtime.kube import RETRY_SECONDS, CredentialsError, secret_data
from speculator_operator.runtime.workqueue import DONE, Result

LABEL = TRAINJOB_LABEL
PLURAL = "speculatortrainjobs"
DEPLOYMENTS = "speculatordeployments"
log = logging.getLogger(__name__)


def observe_children(namespace: str, name: str, obs: Observed) -> None:
    selector = f"{LABEL}={name}"
    for job in kube.list_objects("batch/v1", "Job", namespace, label_selector=selector):
        stage = (job["metadata"].get("labels") or {}).get(STAGE_LABEL)
        if stage:
            obs.jobs[stage] = job
    for dep in kube.list_objects("apps/v1", "Deployment", namespace, label_selector=selector):
        role = (dep["metadata"].get("labels") or {}).get(STAGE_LABEL)
        if role in SERVER_ROLES:
            obs.servers[role] = dep
    obs.lws_served = kube.api_served(group.API_VERSION)
    if obs.lws_served:  # a multi-node server's groups (a list's items carry no kind: it is set here)
        for lws in kube.list_objects(group.API_VERSION, group.KIND, namespace, label_selector=selector):
            role = (lws["metadata"].get("labels") or {}).get(STAGE_LABEL)
            if role in SERVER_ROLES:
                obs.servers[role] = {**lws, "apiVersion": group.API_VERSION, "kind": group.KIND}
    if not obs.jobs:
        return
    with_pods = observe_pods(obs, kube.list_pods(namespace, selector))
    for stage, job in obs.jobs.items():
        if stage not in with_pods and job_state(job)[0] == "Running":
            refused = refused_pods(namespace, job)  # no pod at all: the API server may be refusing them
            if refused:
                obs.stuck.setdefault(stage, refused)


def refused_pods(namespace: str, job: dict[str, Any]) -> tuple[str, str] | None:
    """A Job with no pod at all: what its FailedCreate events say (the API server may be refusing them)."""
    meta = job["metadata"]
    selector = f"involvedObject.uid={meta['uid']},reason=FailedCreate"
    return refused_creation(meta["name"], kube.list_objects("v1", "Event", namespace, field_selector=selector))


def observe(
    name: str, namespace: str, spec: SpeculatorTrainJobSpec, generation: int, status: SpeculatorTrainJobStatus
) -> Observed:
    obs = Observed(generation=generation, status=status)
    provenance = status.provenance
    if provenance is not None and provenance.verifier_layers and provenance.verifier_revision:
        obs.verifier_layers = provenance.verifier_layers
        obs.verifier_revision = provenance.verifier_revision
        obs.verifier_content = provenance.verifier_content
        obs.verifier_model_type = provenance.verifier_model_type
        obs.verifier_max_positions = provenance.verifier_max_positions
    else:
        location = spec.verifier.config_location
        try:
            creds = secret_data(namespace, spec.verifier.credentials.name if spec.verifier.credentials else None)
            if location is None:
                raise CheckpointError("a pvc:// verifier cannot be read by the operator")
            ref = read_verifier(location, creds)
            facts = verifier_facts(ref.config)
        except (CredentialsError, CheckpointError, RenderError) as exc:
            obs.problem = ("VerifierUnreadable", str(exc))
            return obs
        obs.verifier_revision = ref.revision or spec.verifier.revision
        obs.verifier_content = ref.content
        obs.verifier_layers, obs.verifier_model_type, obs.verifier_max_positions = facts
    observe_children(namespace, name, obs)
    return obs


def listed(children: list[dict[str, Any]], obs: Observed) -> dict[tuple[str, str], dict[str, Any] | None]:
    """The stage Jobs and servers this pass listed (by label), and the ones the plan adds that the listing
    showed absent: apply_children need not read them again. The workspace claim is planned only before the
    first Job exists (planning/trainjob.py) and is applied without a read: applying it again unchanged changes
    nothing, and a new run's first pass saves a round trip before its first Job."""
    if obs.problem is not None:
        return {}
    found = {("Job", j["metadata"]["name"]): j for j in obs.jobs.values()}
    found |= {("Deployment", d["metadata"]["name"]): d for d in obs.servers.values()}
    kinds = ("Job", "Deployment", "PersistentVolumeClaim")
    absent = {(c["kind"], c["metadata"]["name"]): None for c in children if c["kind"] in kinds}
    return absent | found


def server_deletes(items: list[tuple[str, str, str]]) -> tuple[Delete, ...]:
    """The servers no stage needs, as deletes: a server's workload (a Deployment, or a LeaderWorkerSet for a
    multi-node server: planning/trainjob._stop_servers) and its Service only."""
    for api_version, kind, _ in items:
        if kind not in ("Deployment", "Service", group.KIND):
            raise ValueError(f"not a server kind: {api_version} {kind}")
    return deletes(items)


def hand_off(namespace: str, name: str, target: str, uri: str) -> tuple[HandOff, str]:
    """Offer the published checkpoint to the SpeculatorDeployment `target`, which takes it into its own status
    (controllers/deployment.py): (reason, message). No spec is written."""
    return handoff_offer(kube.read_custom(DEPLOYMENTS, namespace, target), name, target, uri)


ORDER = ("reconcile", "handoff", "retention", "progress")  # what a pass's one status write is counted as


def run_pass(key: tuple[str, str], causes: frozenset[str]) -> Result:
    """One pass of a SpeculatorTrainJob (runtime/controller.py): the stored object now, the live progress
    held for it, the plan, its writes carried out (runtime/executor.py: the children applied, the servers no
    stage needs deleted, the retention's S3 deletes), the hand-off, the status written at most once, then the
    events. Every pass is the whole reconcile: the stage machine decides from what it observes, not from what
    woke it."""
    namespace, name = key
    if trainjob_progress_only(causes):
        fold_progress(namespace, name)
        return DONE
    body = kube.read_custom(PLURAL, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        _held.forget(key)
        return DONE
    meta = body["metadata"]
    CONTROLLER.generations.done(meta["uid"], int(meta.get("generation") or 0))
    now = datetime.now(UTC)  # the pass's time, read once: every decision in it is made at this time
    status = PassStatus(
        SpeculatorTrainJobStatus, PLURAL, namespace, name, body.get("status") or {}, partial(trainjob_health, now=now)
    )
    events = _fold_progress(key, status, now)
    executor = Executor(body, CONTROLLER.applying, CONTROLLER.recorder)
    with metrics.reconciling("SpeculatorTrainJob"):
        p, result = _reconcile(body, status, executor, now)
    try:
        status.write(ORDER)
    except BaseException:
        executor.post()  # the pass's own events stand even when its status write fails (they did before it)
        raise
    executor.say(*(("Normal", reason, message) for reason, message in events))
    executor.post()
    metrics.stages_finished((body.get("status") or {}).get("stages"), stored(p.status).get("stages"))
    if result is DONE and p.status.phase == "Pending":
        return Result(after=RETRY_SECONDS, cause=Cause.RETRY)  # waiting for the verifier; see status.conditions
    return result


def _reconcile(
    body: dict[str, Any], status: PassStatus[SpeculatorTrainJobStatus], executor: Executor, now: datetime
) -> tuple[Plan, Result]:
    """Observe -> plan -> execute; the status the plan and the outcomes come to is kept for the pass's write."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
    current = status.status
    generation = int(meta.get("generation") or 0)
    parsed = parse_spec(SpeculatorTrainJobSpec, body.get("spec") or {},
                        current.provenance.release if current.provenance else None)  # fmt: skip
    if isinstance(parsed, Problem):
        p = failed(Observed(generation=generation, status=current), parsed.reason, parsed.message, now=now)
        status.set(p.status, "reconcile")
        return p, DONE
    spec, release = parsed
    obs = observe(name, namespace, spec, generation, current)
    p = plan(name, namespace, uid, spec, release, obs, operator_settings.current().image_pull_secrets, now=now)
    status.set(p.status, "reconcile")
    applied = executor.execute(Writes(apply=Apply(p.apply, known=listed(p.apply, obs)) if p.apply else None))
    if isinstance(applied.apply, Terminating):
        return p, DONE
    if isinstance(applied.apply, Refused):
        executor.say(("Warning", "ApplyFailed", applied.apply.message))
        return p, Result(after=RETRY_SECONDS, cause=Cause.RETRY)
    executor.execute(Writes(deletes=server_deletes(p.delete), events=tuple(p.events)))
    if p.handoff is not None:
        target, uri = p.handoff
        reason, message = hand_off(namespace, name, target, uri)
        p.status = handed_off(p.status, generation, target, reason, message, now=now)
        status.set(p.status, "handoff")
        if reason == HandOff.TARGET_MISSING:
            executor.say(("Warning", reason, message))
    if p.prune is not None:
        writes, retention = plan_prune(namespace, name, spec, p.prune)
        pruned = executor.execute(writes)
        if isinstance(pruned.folders, FoldersFailed):
            executor.say(prune_failed(namespace, name, spec, pruned.folders.error))
        elif retention is not None:
            p.status = retained(p.status, retention)
            status.set(p.status, "retention")
    return p, DONE


CONTROLLER = TRAINJOBS


# the last progress line read from each running stage's log, held until its object's pass folds it into the status:
# the periodic lane puts, the pass takes on a work queue's thread
_held: Inbox[tuple[str, str], tuple[str, dict[str, Any]]] = Inbox("trainjob.progress")


def read_progress(body: dict[str, Any]) -> bool:
    """The last trustworthy progress line in the running stage pod's log (rank 0 of several), held for the
    object's next pass; True (and the object enqueued) when it differs from status.progress."""
    meta, status = body["metadata"], body.get("status") or {}
    namespace, name, stage = meta["namespace"], meta["name"], str(status.get("stage"))
    pods = kube.list_pods(namespace, f"{LABEL}={name},{STAGE_LABEL}={stage}")
    pod = progress.stage_pod(pods, kube.dialable)
    if pod is None:
        return False
    try:
        text = kube.pod_log(namespace, pod["metadata"]["name"], "main")
    except Exception as exc:  # a log that cannot be read now is read at the next interval
        log.debug("%s/%s: no log of %s now: %s", namespace, name, pod["metadata"]["name"], exc)
        return False
    parsed = parse_progress(text, stage)
    old = status.get("progress") or {}
    if parsed is None or progress.merged(old, parsed, stage, datetime.now(UTC)) == old:
        return False
    # held, then enqueued: if the object was deleted meanwhile, that pass finds it gone and drops what is held
    _held.put((namespace, name), (stage, parsed))
    CONTROLLER.enqueue(namespace, name, Cause.PROGRESS)
    return True


def fold_progress(namespace: str, name: str) -> list[tuple[str, str]]:
    """The pass of a train job whose only cause is a progress reading: the reading folded into the status as
    stored now, written once, an event posted for each epoch it is the first to show; returns those events."""
    key = (namespace, name)
    body = kube.read_custom(PLURAL, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        _held.forget(key)
        return []
    now = datetime.now(UTC)  # the pass's time, read once
    status = PassStatus(
        SpeculatorTrainJobStatus, PLURAL, namespace, name, body.get("status") or {}, partial(trainjob_health, now=now)
    )
    events = _fold_progress(key, status, now)
    status.write(ORDER)
    executor = Executor(body, CONTROLLER.applying, CONTROLLER.recorder)
    executor.say(*(("Normal", reason, message) for reason, message in events))
    executor.post()  # outside the operator (a test) the controller's recorder posts nothing
    return events


def _fold_progress(
    key: tuple[str, str], status: PassStatus[SpeculatorTrainJobStatus], now: datetime
) -> list[tuple[str, str]]:
    """The progress held for `key` into the pass's status, if its stage is still the running one; the events
    for the epochs it is the first to show."""
    held = _held.take(key)
    current = status.status
    if held is None or current.stage != held[0] or not progress.reading_due(stored(current)):
        return []
    old = stored(current.progress) if current.progress is not None else {}
    new = progress.merged(old, held[1], held[0], now)
    if new == old:
        return []
    status.set(evolve(current, None, progress=new), "progress")
    return progress.epoch_events(old, new)


def forget(namespace: str, name: str) -> None:
    """A deleted train job's progress held for it goes."""
    _held.forget((namespace, name))
