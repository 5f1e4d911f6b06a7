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

from speculator_operator.adapters.checkpoints import load_served, read_verifier
from speculator_operator.adapters.sources import open_source
from speculator_operator.api.common import GROUP, VERSION, evolve, now
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import DEPLOYMENT_LABEL, TRACK_LABEL
from speculator_operator.controllers import drift, observed, telemetry
from speculator_operator.controllers.queues import DEPLOYMENTS
from speculator_operator.domain.checkpoint import CheckpointError, SourceError, audit
from speculator_operator.domain.location import Location
from speculator_operator.domain.priors import pair_size
from speculator_operator.domain.releases import Release
from speculator_operator.planning import Problem, parse_spec, requests
from speculator_operator.planning import canary as canaries
from speculator_operator.planning.deployment import (
    Observed,
    Plan,
    apply_failed,
    failed,
    group_poll_due,
    layout_change_done,
    needs_pods,
    plan,
    refresh_serving,
    retire,
    waits_for_group_api,
)
from speculator_operator.planning.handover import offer_due, offer_of, served, take_offer
from speculator_operator.planning.health import deployment_health
from speculator_operator.planning.inputs import InputAction, draft_change, verifier_change
from speculator_operator.planning.passes import READINESS_PRIORITY, Cause, Step, deployment_steps, refresh_cause
from speculator_operator.planning.pods import pod_problem
from speculator_operator.planning.requests import Request
from speculator_operator.planning.retrain import (
    adopt_retrain,
    holds_for_retrain,
    retrain_due,
    retrain_job,
    retrain_refused,
    retrain_status,
    train_job_output,
)
from speculator_operator.planning.watched import pods_agree
from speculator_operator.render import group
from speculator_operator.render.serving import group_name, workload_kind, workload_name
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import scheduler as periodic
from speculator_operator.runtime import settings as operator_settings
from speculator_operator.runtime.controller import HOOKS, PassStatus
from speculator_operator.runtime.kube import (
    RESYNC_SECONDS,
    RETRY_SECONDS,
    CredentialsError,
    api_message,
    apply_children,
    current_child,
    list_pods,
    namespace_terminating,
    secret_data,
)
from speculator_operator.runtime.workqueue import DONE, Result

PLURAL = "speculatordeployments"
TRAIN_JOBS = "speculatortrainjobs"
POLL_TICK_SECONDS = float(os.environ.get("SPECULATOR_POLL_TICK_SECONDS", "10"))
GROUP_POLL_SECONDS = float(os.environ.get("SPECULATOR_GROUP_POLL_SECONDS", "5"))
log = logging.getLogger(__name__)


def read_train_job(namespace: str, job: str) -> dict[str, Any] | None:
    return kube.read_custom(TRAIN_JOBS, namespace, job)


def _draft_location(
    spec: SpeculatorDeploymentSpec, namespace: str, status: SpeculatorDeploymentStatus
) -> tuple[str, str | None, bool] | Problem:
    """(where the draft is read, its credentials Secret, whether it is a train job's output) or why not yet: a train
    job's hand-over in status first (planning/handover.py), then spec.speculator."""
    handed = served(spec, status)
    if handed is not None:
        return handed.uri, handed.credentials, True
    if spec.speculator.from_train_job:
        job = spec.speculator.from_train_job
        found = train_job_output(read_train_job(namespace, job), job, spec.verifier.model)
        if isinstance(found, Problem):
            return found
        return found[0], found[1], True
    secret = spec.speculator.credentials.name if spec.speculator.credentials else None
    return spec.speculator.source or "", secret, False


def workload(namespace: str, name: str, spec: SpeculatorDeploymentSpec) -> tuple[dict[str, Any] | None, bool]:
    """The workload that serves `spec`'s layout (a Deployment, or a LeaderWorkerSet for a multi-node one), and whether
    its API is served (a Deployment's always is; a LeaderWorkerSet's only where its CRD is installed)."""
    layout = spec.serving.layout
    if layout.multi_node and not kube.api_served(group.API_VERSION):
        return None, False
    api_version, kind = workload_kind(layout)
    return current_child(namespace, workload_name(name, layout), api_version, kind), True


def other_workload(namespace: str, name: str, spec: SpeculatorDeploymentSpec) -> dict[str, Any] | None:
    """The workload of the other kind, left from before a layout change (None where there is none): for a
    multi-node spec the Deployment; for one node the LeaderWorkerSet, looked for only where its API is served."""
    layout = spec.serving.layout
    if layout.multi_node:
        return current_child(namespace, name)
    if not kube.api_served(group.API_VERSION):
        return None
    return current_child(namespace, group_name(name), group.API_VERSION, group.KIND)


def _observe_inputs(
    name: str,
    namespace: str,
    spec: SpeculatorDeploymentSpec,
    release: Release,
    generation: int,
    status: SpeculatorDeploymentStatus,
) -> Observed:
    """What the pass reads: its children and pods, the verifier's config, the draft and its audit, by `release` (the
    one parse_spec resolved: the spec's, else the one the object kept, so that render and audit agree)."""
    child, served = workload(namespace, name, spec)
    obs = Observed(generation=generation, status=status, child=child, lws_served=served)
    obs.other = other_workload(namespace, name, spec)
    if obs.child is not None and needs_pods(status, spec):
        obs.pods = deployment_pods(namespace, name)
    located = _draft_location(spec, namespace, status)
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
        if spec.verifier.location.is_s3:
            obs.verifier_manifest = ref.manifest  # the files its pods stage
    else:
        obs.verifier_revision = spec.verifier.revision  # a pvc:// verifier is read by the pods, which mount it
    try:
        ck = load_served(source, draft_creds)
    except CheckpointError as exc:
        obs.problem = ("CheckpointUnreadable", str(exc))
        return obs
    if ck.resolved_from:
        obs.draft_source = ck.uri  # the exact location a pointer led to: what the pods stage
    if verifier is not None:
        obs.pair = pair_size(ck.drafting_shapes, verifier)
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
        declared=(spec.speculator.algorithm, spec.speculator.speculative_tokens),
    )
    metrics.audited("SpeculatorDeployment", obs.audit)
    return obs


def deployment_pods(namespace: str, name: str) -> list[dict[str, Any]]:
    return list_pods(namespace, f"{DEPLOYMENT_LABEL}={name}")


ORDER = (
    "reconcile",
    "restore",
    "trainjob",
    "request",
    "canary",
    "tuning",
    "poll",
    "retrain",
    "child",
    "resync",
    "scrape",
)
CONTROLLER = DEPLOYMENTS
periodic.controlled(PLURAL, CONTROLLER)


class _Pass:
    """One pass of one SpeculatorDeployment: its steps change `status` (a PassStatus) and collect events; the
    pass writes the status once and posts the events at its end."""

    def __init__(self, raw: dict[str, Any], seen: observed.Seen | None = None) -> None:
        self.raw, self.body = raw, kopf.Body(cast(kopf.RawBody, raw))
        self.seen = seen  # the child and pods as the watches showed them (controllers/observed.py)
        meta = raw["metadata"]
        self.namespace, self.name, self.uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        self.generation = int(meta.get("generation") or 0)
        self.status = PassStatus(
            SpeculatorDeploymentStatus, PLURAL, self.namespace, self.name, raw.get("status") or {}, deployment_health
        )
        self.events: list[tuple[str, str, str]] = []
        self.reconciled: Plan | None = None
        self.retry = False

    def reconcile(self, cause: str, restoring: drift.Restoring | None = None) -> Plan:
        """Observe, plan, apply the children: the whole reconcile, the status it plans kept for the pass's
        write. `restoring` re-applies children whose rendered form did not change: one was changed or deleted
        by hand; a ChildRestored event says what the apply took back."""
        current = self.status.status
        parsed = parse_spec(SpeculatorDeploymentSpec, self.raw.get("spec") or {}, current.release)
        known: dict[drift.Ref, dict[str, Any] | None] = {}
        if isinstance(parsed, Problem):
            p = failed(Observed(generation=self.generation, status=current), parsed.reason, parsed.message)
        else:
            obs = _observe_inputs(self.name, self.namespace, parsed[0], parsed[1], self.generation, current)
            p = plan(
                self.name,
                self.namespace,
                self.uid,
                parsed[0],
                parsed[1],
                obs,
                operator_settings.current().image_pull_secrets,
            )
            layout = parsed[0].serving.layout
            # read by this pass: not read again to apply
            known[(workload_kind(layout)[1], workload_name(self.name, layout))] = obs.child
        p.status = adopt_retrain(current, p.status)
        self.status.set(p.status, cause)
        self.reconciled = p
        if p.children:
            try:
                HOOKS.applying(self.namespace, self.name)
                applied = apply_children(p.children, force=restoring is not None, known=known)
            except ApiException as exc:
                if namespace_terminating(exc):
                    log.info("%s/%s: not applied, the namespace is being deleted", self.namespace, self.name)
                    return p
                message = f"applying the children failed: {exc.status} {exc.reason}: {api_message(exc)}"
                self.status.set(apply_failed(p.status, self.generation, message), cause)
                self.events.append(("Warning", "ApplyFailed", message))
                self.retry = True
                return p
            if ("Deployment", self.name) in applied:
                observed.applied(applied[("Deployment", self.name)].after)
            said = drift.restored(restoring, applied) if restoring else None
            if said:
                log.info("%s/%s: %s; restored", self.namespace, self.name, said)
                self.events.append(("Normal", "ChildRestored", f"{said}; restored"))
            for api_version, kind, name in p.prune:
                kube.delete_object(api_version, kind, self.namespace, name)
        self.events.extend(p.events)
        return p

    def poll(self, parsed: SpeculatorDeploymentSpec) -> None:
        """upgradePolicy: resolve the verifier and the draft revisions again and act on a change
        (onVerifierChange, onDraftChange)."""
        current = self.status.status
        try:
            resolved = resolve_verifier_revision(parsed, self.namespace)
        except (CheckpointError, CredentialsError) as exc:
            log.warning("%s/%s: verifier revision not resolved: %s", self.namespace, self.name, exc)
            return
        action, new_status = verifier_change(parsed, current, resolved, self.generation)
        if action == InputAction.REDEPLOY:
            p = self.reconcile(Cause.POLL)
            if resolved and retrain_due(parsed, action, p.status, resolved):
                self.start_retrain(parsed, resolved)
            return
        if action == InputAction.RETRAIN and resolved:
            if retrain_due(parsed, action, current, resolved):
                self.start_retrain(parsed, resolved)
            return
        if new_status is not None:
            self.status.set(new_status, Cause.POLL)
        if holds_for_retrain(self.status.status, self.generation):
            return  # the pair is pinned until the retrained draft is handed over
        try:
            draft = resolve_draft_revision(parsed, self.namespace, self.status.status)
        except (CheckpointError, CredentialsError) as exc:
            log.warning("%s/%s: draft revision not resolved: %s", self.namespace, self.name, exc)
            return
        change = draft_change(parsed, self.status.status, draft, self.generation)
        self.events.extend(change.events)
        if change.action == InputAction.REDEPLOY:
            self.reconcile(Cause.POLL)
        elif change.status is not None:
            self.status.set(change.status, Cause.POLL)

    def start_retrain(self, spec: SpeculatorDeploymentSpec, revision: str, request: str | None = None) -> None:
        """Create the SpeculatorTrainJob for the new verifier revision (once: its name is per revision, and per
        retrain request)."""
        current = self.status.status
        try:
            manifest = retrain_job(self.name, self.namespace, self.uid, spec, revision, request,
                                   kept_release=current.release)  # fmt: skip
        except ValueError as exc:
            self.status.set(retrain_status(current, self.generation, None, revision, str(exc)), "retrain")
            self.events.append(("Warning", "RetrainUnavailable", str(exc)))
            return
        job = manifest["metadata"]["name"]
        try:
            kube.create_custom(TRAIN_JOBS, self.namespace, manifest)
            self.events.append(("Normal", "Retraining", f"SpeculatorTrainJob {job} for verifier {revision}"))
        except ApiException as exc:
            if exc.status != 409:  # 409: created before (a restart, or the last poll)
                raise
        self.status.set(retrain_status(current, self.generation, job, revision, None), "retrain")

    def refresh(self, parsed: SpeculatorDeploymentSpec, cause: str) -> None:
        """The replica counts and readiness from the child Deployment (and, while it rolls out, the pods' own
        words: a stuck pod's problem; once rolled out, the image the kubelet runs). The child and pods that a
        watch's event showed are used when held (the pods only when they agree with the child), else read."""
        current, seen = self.status.status, self.seen
        multi_node = parsed.serving.layout.multi_node
        # the watches hold Deployments only: a LeaderWorkerSet is read (its API may be missing: nothing to refresh)
        child = seen.child if seen is not None and seen.child is not None and not multi_node else None
        if child is None:
            child, served = workload(self.namespace, self.name, parsed)
            if not served:
                return
        pods = None
        if needs_pods(current, parsed):
            agree = seen is not None and pods_agree(child, seen.pods)
            pods = seen.pods if seen is not None and agree else deployment_pods(self.namespace, self.name)
        new = refresh_serving(parsed, current, child, self.generation, pods)
        done = canaries.promoted(new, self.name, now())
        if done is not None:  # the promoted revision serves every replica: the canary's Deployment goes
            new = evolve(new, None, canary=done[0])
            kube.delete_object(*done[1][:2], self.namespace, done[1][2])
        self.status.set(new, cause)
        if layout_change_done(current, new):
            # a layout change is done when the new workload is ready: the one of the other kind goes
            other = other_workload(self.namespace, self.name, parsed)
            if other is not None:
                (api_version, kind, name), event = retire(other, new.revision, parsed)
                kube.delete_object(api_version, kind, self.namespace, name)
                self.events.append(event)

    def retrain_now(self, parsed: SpeculatorDeploymentSpec, request: str) -> None:
        """A retrain request (planning/requests.py): a train job from upgradePolicy.trainTemplate for the verifier
        as it resolves now, unless there is no template or a retraining is in flight (an event says which)."""
        current = self.status.status
        refused = retrain_refused(parsed, current)
        if refused is not None:
            self.events.append(("Warning" if refused[0] == "RetrainUnavailable" else "Normal", *refused))
            return
        try:
            revision = resolve_verifier_revision(parsed, self.namespace) or current.verifier_revision
        except (CheckpointError, CredentialsError) as exc:
            revision = current.verifier_revision
            log.warning("%s/%s: verifier revision not resolved: %s", self.namespace, self.name, exc)
        if not revision:
            self.events.append(("Warning", "RetrainUnavailable", "retrain requested: the verifier's revision is "
                                "not known yet"))  # fmt: skip
            return
        self.start_retrain(parsed, revision, request)

    def take_offer(self, parsed: SpeculatorDeploymentSpec) -> str | None:
        """Take a train job's hand-over (its spec.deployTo names this deployment) into status when one is due:
        the job's name, or None."""
        job = offer_due(offers((self.namespace, self.name)), self.status.status.handed_over)
        if job is None:
            return None
        taken = take_offer(read_train_job(self.namespace, job), job, self.name, parsed)
        if isinstance(taken, Problem):
            log.info("%s/%s: not taking %s's output: %s", self.namespace, self.name, job, taken.message)
            return None
        self.status.set(evolve(self.status.status, None, handed_over=taken), Cause.TRAINJOB)
        self.events.append(("Normal", "HandedOver", f"SpeculatorTrainJob {job} published {taken.uri}; it is "
                            "served in place of spec.speculator (status.handedOver)"))  # fmt: skip
        return job

    def post(self) -> None:
        for type_, reason, message in self.events:
            kopf.event(self.body, type=type_, reason=reason, message=message[:1024])


@DEPLOYMENTS.handles
def run_pass(key: tuple[str, str], causes: frozenset[str]) -> Result:
    """One pass of a SpeculatorDeployment (runtime/controller.py): the stored object now and what was observed
    for it (a scrape's judgement, children changed by hand) -> the steps its causes ask for -> one status
    write -> its events. The steps, in order: the acceptance judgement (a tuned K rolls a new revision); the
    whole reconcile (a new generation, a retry, a train job's output, a tuned K), or else a restoration of
    children changed by hand, or else the input poll; then, if nothing reconciled, the serving counts."""
    namespace, name = key
    raw = kube.read_custom(PLURAL, namespace, name)
    drifts, seen = drift.take(key), observed.take(key)
    if raw is None or raw["metadata"].get("deletionTimestamp"):
        telemetry.held(key)
        return DONE
    one = _Pass(raw, seen)
    moved = CONTROLLER.generations.wants(one.uid, one.generation, time.monotonic())
    CONTROLLER.generations.done(one.uid, one.generation)
    parsed = parsed_spec(raw.get("spec") or {})
    with metrics.reconciling("SpeculatorDeployment"):
        tuned = decided = False
        judged = telemetry.held(key)
        if judged is not None and parsed is not None:
            new, tuned, events = telemetry.judge(parsed, one.status.status, judged, one.generation)
            one.events.extend(events)
            if new is not None:
                one.status.set(new, "tuning" if tuned else "scrape")
            counted, said, verdict = canaries.judge_intervals(parsed, one.status.status, judged.canary, now())
            one.events.extend(said)
            if counted is not None:
                one.status.set(counted, "canary" if verdict else "scrape")
            if verdict is not None:
                decided = True
                metrics.canary_verdict(one.namespace, one.name, verdict)
        adopted = one.take_offer(parsed) if parsed is not None else None
        if adopted is not None:
            causes = causes | {Cause.TRAINJOB}
        pinned = holds_for_retrain(one.status.status, one.generation, adopted)
        restoring = None if pinned else drift.restoring(drifts)
        asked = requests.pending(raw["metadata"].get("annotations"), one.status.stored.get("requests"))
        steps = deployment_steps(
            causes,
            moved=moved,
            tuned=tuned,
            pinned=pinned,
            restoring=restoring is not None,
            valid=parsed is not None,
            resume=Request.RESUME in asked,
            resolve=Request.RESOLVE in asked,
            decided=decided,
        )
        if steps.main in (Step.RECONCILE, Step.RESTORE):
            one.reconcile(steps.cause, restoring=restoring)
        elif steps.main == Step.POLL and parsed is not None:
            one.poll(parsed)
        if steps.refresh and one.reconciled is None and parsed is not None:
            one.refresh(parsed, refresh_cause(causes))
        if Request.RETRAIN in asked and parsed is not None:
            one.retrain_now(parsed, asked[Request.RETRAIN])
        one.status.set(requests.acted(one.status.status, asked), Cause.REQUEST)
    one.status.write(ORDER)
    one.post()
    if one.retry or (one.reconciled is not None and one.status.status.phase == "Pending"):
        # an input could not be read, or the apply failed: again later (the status says which and why)
        return Result(after=RETRY_SECONDS, cause=Cause.RETRY)
    if waits_for_group_api(one.status.status):
        return Result(after=RESYNC_SECONDS, cause=Cause.RETRY)  # the next reconcile asks discovery again
    if parsed is not None and group_poll_due(parsed, one.status.status):
        return Result(after=GROUP_POLL_SECONDS, cause=Cause.CHILD)
    return DONE


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


def resolve_draft_revision(
    spec: SpeculatorDeploymentSpec, namespace: str, status: SpeculatorDeploymentStatus
) -> str | None:
    """The draft's revision now (a listing or a model_info call, no download), or None if it cannot be said."""
    located = _draft_location(spec, namespace, status)
    if isinstance(located, Problem) or Location.parse(located[0]).is_pvc:
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
    """Every upgradePolicy.pollIntervalSeconds: the object is enqueued with the cause "poll" (its pass resolves
    the revisions). The tick itself stays on the event loop."""
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
    CONTROLLER.enqueue(namespace, meta["name"], Cause.POLL)


def offers(key: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """The succeeded train jobs whose spec.deployTo names the deployment `key`, as their watch showed them."""
    return dict(_offers.get(key) or {})


@periodic.on_gone(PLURAL)
def _forget(namespace: str, name: str, uid: str) -> None:
    _polled.pop(uid, None)
    drift.forget((namespace, name))
    observed.forget((namespace, name))


@kopf.on.startup()
def _fresh(**_: Any) -> None:
    _polled.clear()
    _offers.clear()
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


# (namespace, deployment) -> {train job: (completionTime, uri)}: the succeeded train jobs whose spec.deployTo names
# it, as their watch shows them (the initial listing included, so a restart finds them again)
_offers: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}


def _hold_offer(body: kopf.Body, namespace: str, type_: str | None) -> tuple[str, str] | None:
    """Keep (or drop) the offer a train job's event shows (planning/handover.offer_of): the (deployment, uri) it
    offers, or None."""
    job = str((body.get("metadata") or {}).get("name") or "")
    for held in _offers.values():
        held.pop(job, None)  # what it offered before (it may name another deployment now)
    offer = None if type_ == "DELETED" else offer_of(body)
    if offer is None:
        return None
    target, _, completed, uri = offer
    _offers.setdefault((namespace, target), {})[job] = (completed, uri)
    return target, uri


@kopf.on.event(GROUP, VERSION, PLURAL)
async def requested(*, body: kopf.Body, namespace: str | None, type: str | None, **_: Any) -> None:
    """A request annotation with a value not yet acted on (planning/requests.py): the object is enqueued with the
    cause "request". Told apart in the event loop: the pass records the value, so its own write enqueues nothing."""
    if namespace is None or type == "DELETED":
        return
    meta = body.get("metadata") or {}
    if requests.pending(meta.get("annotations"), (body.get("status") or {}).get("requests")):
        CONTROLLER.enqueue(namespace, str(meta.get("name") or ""), Cause.REQUEST)


@kopf.on.event(GROUP, VERSION, TRAIN_JOBS)
async def train_job_changed(*, body: kopf.Body, namespace: str | None, type: str | None, **kwargs: Any) -> None:
    """A train job finished: the deployments serving its output (speculator.fromTrainJob) and the one its
    spec.deployTo names move now (enqueued with the cause "trainjob"), unless one serves that output already.
    Told apart in the event loop."""
    status = body.get("status") or {}
    phase = status.get("phase")
    if namespace is None:
        return
    offered = _hold_offer(body, namespace, type)
    job = str(body.get("metadata", {}).get("name") or "")
    if offered is not None:
        target, offered_uri = offered
        handed: kopf.Index[Any, Any] = kwargs["handed_to"]
        if (job, offered_uri) not in list(handed.get((namespace, target), [])):
            CONTROLLER.enqueue(namespace, target, Cause.TRAINJOB)
    if phase not in ("Succeeded", "Failed"):
        return
    uri = (status.get("checkpoint") or {}).get("uri")
    index: kopf.Index[Any, Any] = kwargs["fed_by"]
    for owner, serving in index.get((namespace, body.get("metadata", {}).get("name")), []):
        if phase == "Succeeded" and serving == uri:
            continue  # already serving it
        CONTROLLER.enqueue(namespace, owner, Cause.TRAINJOB)


_children = observed.SERVING


@kopf.on.event("apps", "v1", "deployments", labels=_children)  # type: ignore[arg-type]
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
        CONTROLLER.enqueue(namespace, owner, Cause.DRIFT)
    elif changed:
        # a canary's Deployment is not the serving workload the counts read: its pods are held, the child is not
        main = TRACK_LABEL not in ((body.get("metadata") or {}).get("labels") or {})
        observed.hold((namespace, owner), observed.pods(kwargs, (namespace, owner)), child=body if main else None)
        first = READINESS_PRIORITY if changed is observed.Moved.READINESS else 0
        CONTROLLER.enqueue(namespace, owner, Cause.CHILD, first)


@kopf.on.event("", "v1", "services", labels=_children)  # type: ignore[arg-type]
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_children)  # type: ignore[arg-type]
async def other_child_changed(*, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    """A child Service or PodDisruptionBudget deleted or changed by hand: its owner restores it."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if owner and namespace is not None and type and drift.hold(body, namespace, owner, type):
        CONTROLLER.enqueue(namespace, owner, Cause.DRIFT)


@kopf.on.event("", "v1", "pods", labels=_children)  # type: ignore[arg-type]
async def pod_changed(*, body: kopf.Body, namespace: str | None, type: str, **kwargs: Any) -> None:
    """A serving pod got stuck (an image the node cannot get, a crash loop, no node for it): its owner says
    so (the pods as watched held for its pass). Other pod events change nothing the Deployment's own status
    does not already say."""
    owner = (body.get("metadata", {}).get("labels") or {}).get(DEPLOYMENT_LABEL)
    if owner and namespace is not None and type != "DELETED" and pod_problem(dict(body)) is not None:
        observed.hold((namespace, owner), observed.pods(kwargs, (namespace, owner)))
        CONTROLLER.enqueue(namespace, owner, Cause.CHILD)


@periodic.every(PLURAL, interval=RESYNC_SECONDS, idle=RESYNC_SECONDS / 2)
async def resync(body: kopf.Body) -> None:
    """A missed child event must not leave the status stale: the object is compared with its child now and
    then, by a pass that writes only when something differs."""
    meta = body.get("metadata", {})
    if meta.get("namespace"):
        CONTROLLER.enqueue(meta["namespace"], meta["name"], Cause.RESYNC)
