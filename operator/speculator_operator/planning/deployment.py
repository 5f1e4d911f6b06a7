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
- DraftCurrent: RevisionResolved | DraftChanged (the draft's bytes moved under the same source; Pause) |
  CanaryAnalyzing | CanaryRejected (docs/concepts/canary.md)
- Serving: RolledOut | RollingOut | ScaledToZero | NotDeployed | ApplyFailed | ProgressDeadlineExceeded |
  FailedCreate (no pod admitted: Pod Security, a quota) | a stuck pod's reason (planning/pods.py)
- Reconciling / Stalled: derived from the above (planning/health.py)
- Ready: Ready | RollingOut | AuditFailed | InvalidSpec | ReleaseUnsupported | WaitingForInputs | ApplyFailed
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from speculator_operator.api.common import evolve, make_condition, stored
from speculator_operator.api.deployment import (
    AuditSummary,
    LoadEconomics,
    PairEconomics,
    RenderNote,
    ServedImage,
    ServingState,
    SpeculatorDeploymentSpec,
    SpeculatorDeploymentStatus,
)
from speculator_operator.api.labels import REVISION_LABEL
from speculator_operator.api.learning import LearningStatus
from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.domain.checkpoint import AuditReport, Checkpoint, Manifest
from speculator_operator.domain.economics import LoadModel
from speculator_operator.domain.priors import PairSize, pair_load, prior
from speculator_operator.domain.qualification import Level
from speculator_operator.domain.releases import Release
from speculator_operator.planning import canary as canaries
from speculator_operator.planning.adoption import kept_revision
from speculator_operator.planning.inputs import AuditedReason, ServingReason, VerifierReason
from speculator_operator.planning.measured import deployment_device, measured, with_measured
from speculator_operator.planning.pods import first_problem
from speculator_operator.planning.tuning import applied
from speculator_operator.planning.watched import whole_groups
from speculator_operator.render import capture, group
from speculator_operator.render.serving import (
    CaptureOff,
    Inputs,
    RenderError,
    capture_config_map,
    draft_of,
    num_speculative_tokens,
    render,
)

MAX_FINDINGS = 20
CAPTURE_REASONS = (capture.CAPTURE_CLAIM_MISSING, capture.CAPTURE_CREDENTIALS_UNREADABLE)


@dataclass
class Observed:
    generation: int
    status: SpeculatorDeploymentStatus
    verifier_revision: str | None = None
    audit: AuditReport | None = None
    problem: tuple[str, str] | None = None  # (reason, message) when an input could not be read
    child: dict[str, Any] | None = None  # the current Deployment, if any
    draft_source: str | None = None
    pods: list[dict[str, Any]] | None = None  # its pods, read only while it is not rolled out
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads
    verifier_manifest: Manifest | None = None  # an s3 verifier's files, for the pods' stage container
    pair: PairSize | None = None  # what a draft forward and a verifier step read, when the verifier's config was read
    lws_served: bool | None = None  # whether the API server serves LeaderWorkerSets (asked only for a multi-node spec)
    other: dict[str, Any] | None = None  # the workload of the other kind (a layout change), until the new one is ready
    capture_off: CaptureOff | None = None  # spec.learning's storage, where the capture cannot write to it


@dataclass
class Plan:
    children: list[dict[str, Any]] | None
    status: SpeculatorDeploymentStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    prune: list[tuple[str, str, str]] = field(default_factory=list)  # (apiVersion, kind, name) to delete after applying
    # applied even where `children` is None (an input unread, a failed audit: the last good pair serves on): what
    # the user asked of the capture reaches the serving pods whatever becomes of the pair
    always: list[dict[str, Any]] = field(default_factory=list)


def release_moved(status: SpeculatorDeploymentStatus, release: Release) -> bool:
    """Whether the status about to be written names another release or level than the one stored: the one event
    per release (release_event) goes with that write, wherever the pass writes it."""
    return status.release != release.name or status.release_level != str(release.level)


def release_event(release: Release) -> tuple[str, str, str]:
    """Said once per release (and level) a deployment is served with: a Checked release has never been served by this
    project (docs/concepts/releases.md), so the first pods on it deserve a look."""
    what = f"release {release.name} (vLLM {release.vllm}, speculators {release.speculators})"
    if release.level is Level.SERVED:
        return ("Normal", "ReleaseServed", f"{what}: Served, served end to end on vLLM's CPU build in every CI run")
    return (
        "Warning",
        "ReleaseChecked",
        f"{what}: Checked only, qualified without a device (hack/qualify-release) and "
        "never served by this project; watch the first pods (`speculator-operator releases` has the evidence)",
    )


def audit_summary(report: AuditReport) -> AuditSummary:
    findings = [f.as_dict() for f in report.findings if f.severity != "info"][:MAX_FINDINGS]
    return AuditSummary(
        ok=report.ok,
        errors=len(report.errors),
        warnings=sum(1 for f in report.findings if f.severity == "warning"),
        findings=findings,
    )


def failed(obs: Observed, reason: str, message: str, phase: str = "Failed", *, now: datetime) -> Plan:
    gen = obs.generation
    status = evolve(obs.status, gen, make_condition(gen, "Ready", False, reason, message), phase=phase, now=now)
    return Plan(None, status, [("Warning", reason, message)])


def serving_status(
    spec: SpeculatorDeploymentSpec,
    revision: str | None,
    child: dict[str, Any] | None,
    pods: list[dict[str, Any]] | None = None,
    shrinking: bool = False,
) -> ServingState:
    """Replica counts and the Serving readiness of the current revision, from the child Deployment; while
    not rolled out, a stuck pod of that revision (an image the node cannot get, a crash loop) gives the
    reason and the kubelet's words. `shrinking`: replicas beyond `want` are a scale-down under way (an InPlace
    canary taking the incumbent's share), not an old revision's pods, so they do not make it unready."""
    want = spec.serving.replicas
    if child is None:
        return ServingState(ready=False, reason="NotDeployed", replicas=want, ready_replicas=0, updated_replicas=0)
    st = child.get("status") or {}
    meta = child.get("metadata") or {}
    current = (meta.get("annotations") or {}).get(REVISION_LABEL) == revision
    observed = st.get("observedGeneration", 0) >= meta.get("generation", 0)
    # a LeaderWorkerSet counts groups: ready ones, and updated ones (every pod of the group at its new template)
    ready, updated = st.get("readyReplicas", 0) or 0, st.get("updatedReplicas", 0) or 0
    grouped = child.get("kind") == group.KIND
    available = ready if grouped else st.get("availableReplicas", 0) or 0
    if grouped:
        # the LeaderWorkerSet counts a group updated once its leader is: only whole groups count (unknown without the
        # pods: none), so Ready waits for every member of every group
        # and of the wanted ones: a surge group rolled in beside them is no longer counted once it goes (a Deployment's
        # updatedReplicas counts surge pods too, but a group's count would go stale: its drop alone writes nothing)
        updated = min(updated, want, whole_groups(pods, revision, spec.serving.layout.nodes) if pods is not None else 0)
    total = st.get("replicas", 0) or 0
    done = (
        current
        and observed
        and updated >= want
        and available >= want
        and (total == want or (shrinking and total > want))
    )
    reason = "ScaledToZero" if want == 0 and done else ("RolledOut" if done else "RollingOut")
    out = ServingState(ready=done, reason=reason, replicas=want, ready_replicas=ready,
                       updated_replicas=updated if current else 0)  # fmt: skip
    if not done and pods:
        mine = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL) == revision]
        problem = first_problem(mine)
        if problem:
            out.reason, out.problem = problem
    progressing = next((c for c in st.get("conditions") or [] if c.get("type") == "Progressing"), None)
    if not done and progressing and progressing.get("reason") == ServingReason.PROGRESS_DEADLINE_EXCEEDED:
        # the Deployment controller gave up waiting (spec.progressDeadlineSeconds): its words, then the pod's
        said = str(progressing.get("message") or "ProgressDeadlineExceeded")
        out.reason = ServingReason.PROGRESS_DEADLINE_EXCEEDED.value
        out.problem = (said + (f"; {out.problem}" if out.problem else ""))[:1000]
    failure = next((c for c in st.get("conditions") or [] if c.get("type") == "ReplicaFailure"), None)
    if not done and failure and failure.get("status") == "True":
        # no pod could be created at all (Pod Security admission, a quota): the API server's words
        out.reason, out.problem = "FailedCreate", str(failure.get("message") or failure.get("reason"))[:1000]
    return out


SERVER_CONTAINER = "vllm"


def served_image(revision: str, pods: list[dict[str, Any]]) -> ServedImage | None:
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
    return ServedImage(revision=revision, image=image, image_id=image_id)


def pair_economics(spec: SpeculatorDeploymentSpec, ck: Checkpoint, pair: PairSize | None) -> PairEconomics:
    """status.economics before any measurement: the draft priced by its device class prior (domain/priors.py), keyed
    by the device class the spec says or implies (`default` where it says none), and the same row's load model that
    prices a tuned schedule under load (none on a CPU: the saturation model)."""
    max_k = ck.mtp_layers if ck.stitched_mtp else ck.speculative_tokens
    if pair is None:
        return PairEconomics(max_k=max_k)
    algorithm = Algorithm.MTP.value if ck.stitched_mtp else (ck.algorithm or Algorithm.EAGLE3.value)
    device, tp = deployment_device(spec), spec.serving.tensor_parallel_size
    p = prior(pair, device, algorithm, max_k or 1, tp)
    load = pair_load(pair, device, tp)
    return PairEconomics(
        cost_ratio=round(p.cost_ratio, 6),
        prior=p.key,
        parameter_ratio=round(pair.parameter_ratio, 6),
        max_k=max_k,
        source="prior",
        load_model=None if load is None else load_status(load),
    )


def load_status(load: LoadModel) -> LoadEconomics:
    """status.economics.loadModel: the coefficients, to six significant digits (a stable status)."""
    return LoadEconomics.model_validate({k: float(f"{v:.6g}") for k, v in asdict(load).items()})


def _what(ck: Checkpoint) -> str:
    return "stitched MTP model" if ck.stitched_mtp else f"{ck.algorithm} draft"


def plan(
    name: str,
    namespace: str,
    uid: str | None,
    spec: SpeculatorDeploymentSpec,
    release: Release,
    obs: Observed,
    pull_secrets: tuple[str, ...] = (),
    *,
    now: datetime,
) -> Plan:
    """`pull_secrets`: the imagePullSecrets every rendered pod names (the operator's settings); `now`: the pass's
    time (a condition's transition, a canary's start)."""
    p = _plan(name, namespace, uid, spec, release, obs, pull_secrets, now=now)
    p.status = capture_noted(p.status, obs.capture_off if spec.learning is not None else None)
    p.status, dropped = learning_marked(p.status, spec, name)
    p.prune += dropped
    if spec.learning is not None:
        p.children = [c for c in p.children or [] if c["kind"] != "ConfigMap"] if p.children is not None else None
        p.always = [capture_config_map(name, namespace, uid, spec, obs.capture_off)]
    return p


def _plan(
    name: str,
    namespace: str,
    uid: str | None,
    spec: SpeculatorDeploymentSpec,
    release: Release,
    obs: Observed,
    pull_secrets: tuple[str, ...] = (),
    *,
    now: datetime,
) -> Plan:
    gen = obs.generation
    if obs.problem is not None:
        reason, message = obs.problem
        keep = obs.child is not None
        status = evolve(
            obs.status, gen,
            make_condition(gen, "Audited", None, reason, message),
            make_condition(gen, "Ready", False if not keep else None, "WaitingForInputs", message),
            phase="Degraded" if keep else "Pending", now=now,
        )  # fmt: skip
        return Plan(None, status, [("Warning", reason, message)])
    report = obs.audit
    assert report is not None
    ck = report.checkpoint
    common: dict[str, Any] = {
        "release": release.name,
        "release_level": str(release.level),
        "vllm": release.vllm,
        "algorithm": Algorithm.MTP.value if ck.stitched_mtp else ck.algorithm,
        "verifier_revision": obs.verifier_revision,
        "draft_revision": ck.revision,
        "draft_source": obs.draft_source or spec.speculator.source,
        "audit": audit_summary(report),
        "economics": pair_economics(spec, ck, obs.pair),
    }
    verifier_cond = make_condition(
        gen, "VerifierCurrent", True, VerifierReason.RESOLVED, f"verifier at {obs.verifier_revision}"
    )
    draft_cond = make_condition(gen, "DraftCurrent", True, "RevisionResolved", f"draft at {ck.revision}")
    if not report.ok:
        first = report.errors[0]
        message = f"{len(report.errors)} audit error(s); first: {first.rule}: {first.message}"
        keep = obs.child is not None
        status = evolve(
            obs.status, gen,
            make_condition(gen, "Audited", False, AuditedReason.FAILED, message),
            verifier_cond,
            draft_cond,
            make_condition(gen, "Ready", False, AuditedReason.FAILED,
                           message + ("; the last good pair keeps serving" if keep else "")),
            phase="Degraded" if keep else "Failed", now=now,
            **common,
        )  # fmt: skip
        said = [release_event(release)] if release_moved(obs.status, release) else []  # written with `common`
        return Plan(None, status, [("Warning", AuditedReason.FAILED, message), *said])
    try:
        draft = draft_of(ck)
    except RenderError as exc:
        return failed(obs, AuditedReason.FAILED, str(exc), now=now)
    tuned = applied(spec, obs.status.tuning, draft.speculative_tokens)
    found = measured(spec, release, ck.provenance, draft.algorithm, draft.speculative_tokens, tuned)
    common["economics"] = with_measured(common["economics"], found, obs.status.economics)
    tuned = tuned or found.tuned
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
        pull_secrets=pull_secrets,
        capture_off=obs.capture_off,
    )
    try:
        rendered = render(inputs)
        kept = kept_revision(inputs, rendered, obs.status.revision, obs.child)
        if kept is not None:  # an earlier operator's name for this same pair: no rollout for a name
            rendered = render(replace(inputs, keep_revision=kept))
    except RenderError as exc:
        return failed(obs, exc.reason, str(exc), now=now)
    if spec.serving.layout.multi_node and obs.lws_served is False:
        message = f"{spec.serving.layout.nodes} nodes per replica need the LeaderWorkerSet API; {group.INSTALL_HINT}"
        keep = obs.other is not None  # the single-node pair serves until the groups can
        return failed(obs, ServingReason.LWS_UNAVAILABLE, message, phase="Degraded" if keep else "Failed", now=now)
    new = canaries.Rendered(rendered.revision, ck.revision, obs.verifier_revision, canaries.applied_revision(obs.child))
    move = canaries.decide(spec, obs.status, new, gen)
    shaped = canaries.shape(move, spec, obs.status, rendered.children, new, obs.child, obs.draft_source, gen, now)
    revision = rendered.revision
    notes = [RenderNote(reason=reason, message=message) for reason, message in rendered.notes]
    k = num_speculative_tokens(spec, draft, tuned)
    if shaped.held:  # the incumbent keeps serving under its own revision, draft and K
        revision, notes, k = (
            obs.status.revision or revision,
            list(obs.status.render_notes or []),
            obs.status.num_speculative_tokens or k,
        )
        common.update(draft_revision=obs.status.draft_revision, draft_source=obs.status.draft_source)
        draft_cond = canaries.draft_condition(gen, shaped.canary, draft_cond)
    want = spec if shaped.incumbent_replicas is None else canaries.with_replicas(spec, shaped.incumbent_replicas)
    serving = serving_status(want, revision, obs.child, obs.pods, shrinking=shaped.incumbent_replicas is not None)
    if obs.child is None:
        serving.reason = "RollingOut"  # its Deployment is applied right after this status is written
    serving_reason, serving_message = (
        serving.reason,
        serving.problem or _revision_words(revision, notes),
    )
    ready = serving.ready
    status = evolve(
        obs.status, gen,
        make_condition(gen, "Audited", True, AuditedReason.PASSED,
              f"{_what(ck)} passed {len(report.findings)} finding(s) without errors" if report.findings
              else f"{_what(ck)} passed the audit"),
        verifier_cond,
        draft_cond,
        make_condition(gen, "Serving", ready, serving_reason, serving_message),
        make_condition(gen, "Ready", ready, "Ready" if ready else "RollingOut",
              f"{serving.ready_replicas}/{serving.replicas} replicas of revision {revision} ready"),
        phase="Ready" if ready else "Deploying", now=now,
        revision=revision,
        render_notes=notes or None,
        num_speculative_tokens=k,
        replicas=serving.replicas,
        ready_replicas=serving.ready_replicas,
        updated_replicas=serving.updated_replicas,
        canary=shaped.canary,
        **common,
    )  # fmt: skip
    image = served_image(revision, obs.pods) if ready and obs.pods else None
    if image is not None:
        status = evolve(status, None, served_image=image)
    events = list(shaped.events or [])
    if obs.status.revision != revision:
        events.append(("Normal", "RollingOut", f"applying revision {revision}"))
    if release_moved(obs.status, release):
        events.append(release_event(release))
    status, gone, said = clean_up(status, name, spec, obs.other, rendered.revision, now)
    return Plan(shaped.children, status, events + said, list(shaped.prune) + gone)


def capture_noted(status: SpeculatorDeploymentStatus, off: CaptureOff | None) -> SpeculatorDeploymentStatus:
    """status.renderNotes says why the capture is off, whatever path the pass took (a held canary keeps the
    incumbent's notes, a failed pass renders none): the capture's ConfigMap is applied on every path."""
    notes = [n for n in status.render_notes or [] if n.reason not in CAPTURE_REASONS]
    if off is not None:
        notes.append(RenderNote(reason=off.reason, message=off.message))
    if notes == list(status.render_notes or []):
        return status
    return evolve(status, None, render_notes=notes or None)


def learning_marked(
    status: SpeculatorDeploymentStatus, spec: SpeculatorDeploymentSpec, name: str
) -> tuple[SpeculatorDeploymentStatus, list[tuple[str, str, str]]]:
    """status.learning is there while spec.learning is (empty until the capture's counts are read): the mark that
    the capture's ConfigMap exists, so that turning learning off deletes it once, and no pass of a deployment that
    never learned asks for a delete."""
    if spec.learning is not None:
        if status.learning is None:
            return evolve(status, None, learning=LearningStatus()), []
        return status, []
    if status.learning is not None:
        return evolve(status, None, learning=None), [("v1", "ConfigMap", capture.config_map_name(name))]
    return status, []


def clean_up(
    status: SpeculatorDeploymentStatus,
    name: str,
    spec: SpeculatorDeploymentSpec,
    other: dict[str, Any] | None,
    revision: str | None,
    now: datetime,
) -> tuple[SpeculatorDeploymentStatus, list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """What goes once the new pair serves, for a reconcile and a refresh alike: a promoted canary's Deployment once
    the promoted revision serves every replica (the canary marked Promoted), and `other`, the workload of the other
    kind left from a layout change, once the new one is ready (planning/deployment.retire). The status, the
    children to delete as (apiVersion, kind, name), and the events."""
    gone: list[tuple[str, str, str]] = []
    said: list[tuple[str, str, str]] = []
    done = canaries.promoted(status, name, now)
    if done is not None:  # the promoted revision serves every replica: the canary's Deployment goes
        status = evolve(status, None, canary=done[0])
        gone.append(done[1])
    if other is not None and status.phase == "Ready":
        ref, event = retire(other, revision, spec)
        gone.append(ref)
        said.append(event)
    return status, gone, said


def waits_for_group_api(status: SpeculatorDeploymentStatus) -> bool:
    """Whether the status says the spec waits for the LeaderWorkerSet API: the pass reconciles again a resync later
    (a resync alone only refreshes the serving counts), so that an API installed meanwhile is found without a
    restart."""
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    return ready is not None and ready.reason == ServingReason.LWS_UNAVAILABLE


def waits_for_capture_storage(status: SpeculatorDeploymentStatus) -> bool:
    """Whether the capture is off for want of its storage (a claim or a Secret, which no watch follows): the pass
    reconciles again a resync later, and a Secret or claim made meanwhile turns it on without an edit."""
    return any(note.reason in CAPTURE_REASONS for note in status.render_notes or [])


def layout_change_done(before: SpeculatorDeploymentStatus, after: SpeculatorDeploymentStatus) -> bool:
    """Whether a refresh just made the workload ready: the moment a workload of the other kind, left from a layout
    change, is retired."""
    return after.phase == "Ready" and before.phase != "Ready"


def group_poll_due(spec: SpeculatorDeploymentSpec, status: SpeculatorDeploymentStatus) -> bool:
    """Whether the pass asks to run again soon: a LeaderWorkerSet rolling out (no watch follows its kind, whose API
    may come and go; pod events alone miss its status catching up)."""
    return spec.serving.layout.multi_node and status.phase == "Deploying"


def retire(
    other: dict[str, Any], revision: str | None, spec: SpeculatorDeploymentSpec
) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """A layout change is done once the new workload is ready: the workload of the other kind, which served until
    then, is deleted. Its (apiVersion, kind, name), and the event that says so."""
    meta = other.get("metadata") or {}
    ref = (str(other.get("apiVersion")), str(other.get("kind")), str(meta.get("name")))
    said = f"{ref[1]} {ref[2]} deleted: revision {revision} serves as {spec.serving.layout.describe()}"
    return ref, ("Normal", "LayoutChanged", said)


def refresh_serving(
    spec: SpeculatorDeploymentSpec,
    status: SpeculatorDeploymentStatus,
    child: dict[str, Any] | None,
    generation: int,
    pods: list[dict[str, Any]] | None = None,
    *,
    now: datetime,
) -> SpeculatorDeploymentStatus:
    """The status after the child Deployment (or one of its pods) changed (no new audit, no new render).
    `updatedReplicas` alone moving is not worth a write: it is carried by the next change of readiness
    (a rollout costs a write per ready count, not one more per pod created)."""
    revision = status.revision
    if status.phase not in ("Deploying", "Ready") or not revision:
        return status
    want = canaries.serving_replicas(spec, status)
    shrinking = want != spec.serving.replicas
    if shrinking:  # an InPlace canary holds the incumbent's share
        spec = canaries.with_replicas(spec, want)
    serving = serving_status(spec, revision, child, pods, shrinking=shrinking)
    ready = serving.ready
    replicas = f"{serving.ready_replicas}/{serving.replicas} replicas of revision {revision} ready"
    said = _revision_words(revision, status.render_notes or [])
    new = evolve(
        status, generation,
        make_condition(generation, "Serving", ready, serving.reason, serving.problem or said),
        make_condition(generation, "Ready", ready, "Ready" if ready else "RollingOut",
                       replicas + (f"; {serving.problem}" if serving.problem else "")),
        phase="Ready" if ready else "Deploying", now=now,
        replicas=serving.replicas,
        ready_replicas=serving.ready_replicas,
    )  # fmt: skip
    if ready and pods:
        image = served_image(revision, pods)
        if image is not None:
            new = evolve(new, None, served_image=image)
    if stored(new) == stored(status):
        return status  # `updatedReplicas` alone moving is carried by the next change
    return evolve(new, None, updated_replicas=serving.updated_replicas)


def _revision_words(revision: str, notes: list[RenderNote]) -> str:
    """The Serving condition's message while nothing is wrong: the revision and the render's notes."""
    return "; ".join([f"revision {revision}", *(f"{n.reason}: {n.message}" for n in notes)])


def needs_pods(status: SpeculatorDeploymentStatus, spec: SpeculatorDeploymentSpec) -> bool:
    """Whether the pods are worth reading: while a revision is rolling out (a Ready resource costs no reads), and
    always for LeaderWorkerSet groups, whose updated count is taken from the pods (whole groups only)."""
    return status.phase == "Deploying" or spec.serving.layout.multi_node


def apply_failed(
    status: SpeculatorDeploymentStatus, generation: int, message: str, *, now: datetime
) -> SpeculatorDeploymentStatus:
    """The status when the API server refused a child: not serving, with its words; retried."""
    return evolve(
        status, generation,
        make_condition(generation, "Serving", False, ServingReason.APPLY_FAILED, message),
        make_condition(generation, "Ready", False, ServingReason.APPLY_FAILED, message),
        phase="Degraded" if status.ready_replicas else "Deploying", now=now,
    )  # fmt: skip
