"""The pass of a SpeculatorDeployment: observe -> plan -> execute -> status. Each step reads what it needs, asks
a planner (planning/), hands the writes it plans to the executor (runtime/executor.py) and folds what they came to
into the one status write; decisions live in the planners, the watches that enqueue its key in
controllers/watches.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf
from pydantic import ValidationError

from speculator_operator.adapters.checkpoints import load_served, read_verifier
from speculator_operator.adapters.sources import open_source
from speculator_operator.api.common import evolve
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import DEPLOYMENT_LABEL
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
    clean_up,
    failed,
    group_poll_due,
    layout_change_done,
    needs_pods,
    plan,
    refresh_serving,
    waits_for_capture_storage,
    waits_for_group_api,
)
from speculator_operator.planning.handover import offer_due, offer_of, served, take_offer
from speculator_operator.planning.health import deployment_health
from speculator_operator.planning.judgement import judge
from speculator_operator.planning.passes import Cause, Step, deployment_steps, refresh_cause
from speculator_operator.planning.poll import Polled, draft_polled, retrain_after_reconcile, verifier_polled
from speculator_operator.planning.requests import Request
from speculator_operator.planning.retrain import (
    adopt_retrain,
    holds_for_retrain,
    plan_retrain,
    retrain_refused,
    retraining,
    train_job_output,
)
from speculator_operator.planning.watched import pods_agree
from speculator_operator.planning.writes import Apply, Writes, deletes
from speculator_operator.render import group
from speculator_operator.render.capture import CAPTURE_CLAIM_MISSING, CAPTURE_CREDENTIALS_UNREADABLE
from speculator_operator.render.serving import CaptureOff, group_name, workload_kind, workload_name
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import settings as operator_settings
from speculator_operator.runtime.controller import PassStatus
from speculator_operator.runtime.executor import Created, Executor, Moved, Refused, Terminating
from speculator_operator.runtime.inbox import Inbox
from speculator_operator.runtime.kube import (
    RETRY_SECONDS,
    CredentialsError,
    current_child,
    list_pods,
    read_child,
    secret_data,
)
from speculator_operator.runtime.workqueue import DONE, Result

PLURAL = "speculatordeployments"
TRAIN_JOBS = "speculatortrainjobs"
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


def capture_storage(namespace: str, spec: SpeculatorDeploymentSpec) -> CaptureOff | None:
    """Whether spec.learning's storage can be written to, as far as the operator can tell without writing: the
    claim of a pvc:// location exists, the credentials Secret of an s3:// one can be read. None: capture."""
    if spec.learning is None:
        return None
    storage = spec.learning.storage
    where = Location.parse(storage.location)
    if where.is_pvc:
        if read_child("v1", "PersistentVolumeClaim", namespace, where.root) is None:
            message = f"PersistentVolumeClaim {namespace}/{where.root} of learning.storage not found: capture is off"
            return CaptureOff(CAPTURE_CLAIM_MISSING, message, claim=True)
        return None
    if storage.credentials is not None:
        try:
            secret_data(namespace, storage.credentials.name)
        except CredentialsError as exc:
            return CaptureOff(CAPTURE_CREDENTIALS_UNREADABLE, f"learning.storage.credentials: {exc}: capture is off")
    return None


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
    obs.capture_off = capture_storage(namespace, spec)
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


class _Pass:
    """One pass of one SpeculatorDeployment: each step observes, asks a planner, has the executor carry out the
    writes it plans (runtime/executor.py) and folds what they came to into `status` (a PassStatus); the pass
    writes the status once, and the executor posts the events at its end."""

    def __init__(self, raw: dict[str, Any], seen: observed.Seen | None = None) -> None:
        self.raw = raw
        self.executor = Executor(raw, CONTROLLER.applying, CONTROLLER.recorder)
        self.seen = seen  # the child and pods as the watches showed them (controllers/observed.py)
        meta = raw["metadata"]
        self.namespace, self.name, self.uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        self.generation = int(meta.get("generation") or 0)
        self.now = datetime.now(UTC)  # the pass's time, read once: every decision in it is made at this time
        self.status = PassStatus(
            SpeculatorDeploymentStatus,
            PLURAL,
            self.namespace,
            self.name,
            raw.get("status") or {},
            partial(deployment_health, now=self.now),
        )
        self.reconciled: Plan | None = None
        self.retry = False
        self.moved = False  # a restoration met children that kept moving: run again soon, restoring then

    def reconcile(self, cause: str, restoring: drift.Restoring | None = None) -> Plan:
        """Observe, plan, execute (the children applied, then what the plan deletes): the whole reconcile, the
        status it plans and what its apply came to (ApplyFailed) kept for the pass's write. `restoring`
        re-applies children whose rendered form did not change: one was changed or deleted by hand; a
        ChildRestored event says what the apply took back."""
        current = self.status.status
        parsed = parse_spec(SpeculatorDeploymentSpec, self.raw.get("spec") or {}, current.release)
        known: dict[drift.Ref, dict[str, Any] | None] = {}
        if isinstance(parsed, Problem):
            p = failed(
                Observed(generation=self.generation, status=current), parsed.reason, parsed.message, now=self.now
            )
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
                now=self.now,
            )
            layout = parsed[0].serving.layout
            # read by this pass: not read again to apply
            known[(workload_kind(layout)[1], workload_name(self.name, layout))] = obs.child
        p.status = adopt_retrain(current, p.status)
        self.status.set(p.status, cause)
        self.reconciled = p
        children = [*(p.children or []), *p.always]
        if children:
            apply = Apply(children, force=restoring is not None, known=known)
            outcome = self.executor.execute(Writes(apply=apply))
            if isinstance(outcome.apply, Terminating):
                return p
            if isinstance(outcome.apply, Moved):
                log.info("%s/%s: a child moved under its restoration (%s); again soon", self.namespace, self.name,
                         outcome.apply.answer)  # fmt: skip
                self.moved = True
                return p
            if isinstance(outcome.apply, Refused):
                message = outcome.apply.message
                self.status.set(apply_failed(p.status, self.generation, message, now=self.now), cause)
                self.executor.say(("Warning", "ApplyFailed", message))
                self.retry = True
                return p
            applied = outcome.applied
            if ("Deployment", self.name) in applied:
                observed.applied(applied[("Deployment", self.name)].after)
            said = drift.restored(restoring, applied) if restoring else None
            if said:
                log.info("%s/%s: %s; restored", self.namespace, self.name, said)
                self.executor.say(("Normal", "ChildRestored", f"{said}; restored"))
        # what the apply left behind goes after the applied children are recorded, so that their watch's echo finds
        # them known (a plan without children may still delete: spec.learning removed while the pair waits)
        if p.prune:
            self.executor.execute(Writes(deletes=deletes(p.prune)))
        self.executor.say(*p.events)
        return p

    def poll(self, parsed: SpeculatorDeploymentSpec) -> Polled:
        """upgradePolicy: resolve the verifier's revision (and the draft's, when the verifier's poll asks) again:
        what a change comes to (onVerifierChange, onDraftChange) is the plan returned (planning/poll.py)."""
        try:
            resolved = resolve_verifier_revision(parsed, self.namespace)
        except (CheckpointError, CredentialsError) as exc:
            log.warning("%s/%s: verifier revision not resolved: %s", self.namespace, self.name, exc)
            return Polled()
        return verifier_polled(parsed, self.status.status, resolved, self.generation, now=self.now)

    def poll_draft(self, parsed: SpeculatorDeploymentSpec) -> Polled:
        try:
            draft = resolve_draft_revision(parsed, self.namespace, self.status.status)
        except (CheckpointError, CredentialsError) as exc:
            log.warning("%s/%s: draft revision not resolved: %s", self.namespace, self.name, exc)
            return Polled()
        return draft_polled(parsed, self.status.status, draft, self.generation, now=self.now)

    def follow(self, parsed: SpeculatorDeploymentSpec, polled: Polled) -> None:
        """Carry out a poll's plan: its status and events, the reconcile, the retraining, the draft's poll."""
        if polled.status is not None:
            self.status.set(polled.status, Cause.POLL)
        self.executor.say(*polled.events)
        before = self.status.status
        if polled.reconcile:
            before = self.reconcile(Cause.POLL).status
        if polled.retrain and (
            not polled.retrain_if_degraded or retrain_after_reconcile(parsed, before, polled.retrain)
        ):
            self.start_retrain(parsed, polled.retrain)
        if polled.draft:
            self.follow(parsed, self.poll_draft(parsed))

    def start_retrain(self, spec: SpeculatorDeploymentSpec, revision: str, request: str | None = None) -> None:
        """Create the SpeculatorTrainJob for the new verifier revision (planning/retrain.plan_retrain: once, its
        name is per revision, and per retrain request; one that exists already was created before)."""
        new, writes = plan_retrain(self.name, self.namespace, self.uid, spec, self.status.status, self.generation,
                                   revision, request, now=self.now)  # fmt: skip
        outcome = self.executor.execute(writes)
        for created in outcome.created:
            if isinstance(created, Created):
                self.executor.say(retraining(created.name, revision))
        self.status.set(new, "retrain")

    def refresh(self, parsed: SpeculatorDeploymentSpec, cause: str) -> Writes:
        """The replica counts and readiness from the child Deployment (and, while it rolls out, the pods' own
        words: a stuck pod's problem; once rolled out, the image the kubelet runs), and what goes once the new
        pair serves (planning/deployment.clean_up): the writes returned. The child and pods that a watch's
        event showed are used when held (the pods only when they agree with the child), else read."""
        current, seen = self.status.status, self.seen
        multi_node = parsed.serving.layout.multi_node
        # the watches hold Deployments only: a LeaderWorkerSet is read (its API may be missing: nothing to refresh)
        child = seen.child if seen is not None and seen.child is not None and not multi_node else None
        if child is None:
            child, served = workload(self.namespace, self.name, parsed)
            if not served:
                return Writes()
        pods = None
        if needs_pods(current, parsed):
            agree = seen is not None and pods_agree(child, seen.pods)
            pods = seen.pods if seen is not None and agree else deployment_pods(self.namespace, self.name)
        new = refresh_serving(parsed, current, child, self.generation, pods, now=self.now)
        # the workload of the other kind (a layout change) is looked for only when the new one just became ready
        other = other_workload(self.namespace, self.name, parsed) if layout_change_done(current, new) else None
        new, gone, said = clean_up(new, self.name, parsed, other, new.revision, self.now)
        self.status.set(new, cause)
        return Writes(deletes=deletes(gone), events=tuple(said))

    def retrain_now(self, parsed: SpeculatorDeploymentSpec, request: str) -> None:
        """A retrain request (planning/requests.py): a train job from upgradePolicy.trainTemplate for the verifier
        as it resolves now, unless there is no template or a retraining is in flight (an event says which)."""
        current = self.status.status
        refused = retrain_refused(parsed, current)
        if refused is not None:
            self.executor.say(("Warning" if refused[0] == "RetrainUnavailable" else "Normal", *refused))
            return
        try:
            revision = resolve_verifier_revision(parsed, self.namespace) or current.verifier_revision
        except (CheckpointError, CredentialsError) as exc:
            revision = current.verifier_revision
            log.warning("%s/%s: verifier revision not resolved: %s", self.namespace, self.name, exc)
        if not revision:
            self.executor.say(("Warning", "RetrainUnavailable", "retrain requested: the verifier's revision is "
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
        self.executor.say(("Normal", "HandedOver", f"SpeculatorTrainJob {job} published {taken.uri}; it is "
                           "served in place of spec.speculator (status.handedOver)"))  # fmt: skip
        return job


def run_pass(key: tuple[str, str], causes: frozenset[str]) -> Result:
    """One pass of a SpeculatorDeployment (runtime/controller.py): the stored object now and what was observed
    for it (a scrape's judgement, children changed by hand) -> the steps its causes ask for -> one status
    write -> its events (posted by the executor, which carried out every write the steps planned). The steps,
    in order: the acceptance judgement (a tuned K rolls a new revision); the whole reconcile (a new generation, a
    retry, a train job's output, a tuned K), or else a restoration of children changed by hand, or else the input
    poll; then, if nothing reconciled, the serving counts."""
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
            new, tuned, events = judge(parsed, one.status.status, judged, one.generation, now=one.now)
            one.executor.say(*events)
            if new is not None:
                one.status.set(new, "tuning" if tuned else "scrape")
            counted, said, verdict = canaries.judge_intervals(parsed, one.status.status, judged.canary, one.now)
            one.executor.say(*said)
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
            one.follow(parsed, one.poll(parsed))
        if steps.refresh and one.reconciled is None and parsed is not None:
            one.executor.execute(one.refresh(parsed, refresh_cause(causes)))
        if Request.RETRAIN in asked and parsed is not None:
            one.retrain_now(parsed, asked[Request.RETRAIN])
        one.status.set(requests.acted(one.status.status, asked), Cause.REQUEST)
    one.status.write(ORDER)
    one.executor.post()
    if one.moved:
        drift.keep(key, drifts)  # the next pass restores them
        return Result(retry=True)  # a conflict: requeued with the key's back-off, not a failure
    if one.retry or (one.reconciled is not None and one.status.status.phase == "Pending"):
        # an input could not be read, or the apply failed: again later (the status says which and why)
        return Result(after=RETRY_SECONDS, cause=Cause.RETRY)
    if waits_for_group_api(one.status.status) or waits_for_capture_storage(one.status.status):
        # the next reconcile asks discovery, or reads the capture's claim or Secret, again
        return Result(after=operator_settings.current().resync_seconds, cause=Cause.RETRY)
    if parsed is not None and group_poll_due(parsed, one.status.status):
        return Result(after=operator_settings.current().group_poll_seconds, cause=Cause.CHILD)
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


def offers(key: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """The succeeded train jobs whose spec.deployTo names the deployment `key`, as their watch showed them."""
    return dict(_offers.get(key) or {})  # a copy: the event loop replaces what is held, never changes it


# (namespace, deployment) -> {train job: (completionTime, uri)}: the succeeded train jobs whose spec.deployTo names
# it, as their watch shows them (the initial listing included, so a restart finds them again); the watch puts,
# the deployment's pass reads (and leaves them: an offer stands while its train job does)
_offers: Inbox[tuple[str, str], dict[str, tuple[str, str]]] = Inbox("deployment.offers")


def hold_offer(body: kopf.Body, namespace: str, type_: str | None) -> tuple[str, str] | None:
    """Keep (or drop) the offer a train job's event shows (planning/handover.offer_of): the (deployment, uri) it
    offers, or None."""
    job = str((body.get("metadata") or {}).get("name") or "")
    # what it offered before goes (it may name another deployment now)
    _offers.update_all(lambda _, held: ({k: v for k, v in held.items() if k != job} or None) if job in held else held)
    offer = None if type_ == "DELETED" else offer_of(body)
    if offer is None:
        return None
    target, _, completed, uri = offer
    _offers.update((namespace, target), lambda held: {**(held or {}), job: (completed, uri)})
    return target, uri


def forget_offers() -> None:
    """A fresh start: the watch lists every train job again."""
    _offers.clear()
