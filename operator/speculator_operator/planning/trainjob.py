"""The SpeculatorTrainJob stage machine: pure decisions from the observed children to the next ones.

`plan(...)` gets the spec, the resolved verifier (layers and revision) and what exists (each stage's
Job, the reports its pods left, the vLLM servers) and returns the children to apply, the servers to
remove, the status and the events. Stages run in order (fetch, regenerate, prepare, extract, train,
audit, publish); the first one that has not succeeded is the current one. Its Job is created once the
vLLM server it talks to is available; a Job retries failed pods itself (backoffLimit = spec.retries,
with Kubernetes' exponential back-off) and a Job that fails for good fails the run, naming the stage,
the reason and the log tail. Nothing is published unless every stage before publish succeeded.
Servers exist only while a stage needs them (they hold GPUs).

Phases: Pending, Regenerating, Preparing, Extracting, Training, Converting, Stitching, Auditing, Evaluating,
Publishing, Succeeded, Failed. A convert job runs fetch, convert, audit, publish; an mtp job stitches its head
into the verifier before the audit. With spec.evaluation an evaluate stage between audit and publish measures
the draft's acceptance in the pinned vLLM and refuses to publish one below its bounds.
Condition reasons:
- Ready: Succeeded | StageFailed | InvalidSpec | ReleaseUnsupported | VerifierUnreadable (and the Failed reasons);
  absent while a stage runs (kstatus reads a started run as Current, planning/health.py)
- Failed: True: StageFailed | InvalidSpec | ReleaseUnsupported | AuditFailed | AcceptanceBelowThreshold | ZeroDrafts |
  EvaluationServerNotReady; False while a stage runs: Running | WaitingForServer | the kubelet's reason for a stuck
  stage pod (ImagePullBackOff, CrashLoopBackOff, ...)
- Reconciling / Stalled: planning/health.py
- Audited: AuditPassed | AuditFailed
- Published: Published
- HandedOff: Offered | Following | TargetMissing (Patched: written by operators before 2026-12)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from speculator_operator.api.common import Condition, conditions_of, evolve, make_condition, stamp, stored
from speculator_operator.api.podcontract import FAILED_EVALUATIONS, EvaluationOutcome, StageReport
from speculator_operator.api.trainjob import (
    EvaluationResult,
    Progress,
    Provenance,
    Retention,
    SpeculatorTrainJobSpec,
    SpeculatorTrainJobStatus,
)
from speculator_operator.domain.algorithms import MTP_COUNT_KEY, Algorithm
from speculator_operator.domain.releases import Release
from speculator_operator.planning import progress
from speculator_operator.planning.inputs import ServingReason
from speculator_operator.planning.retention import retention_due
from speculator_operator.planning.sweep import SWEEP_FAILED, curve_of, failed_at, failure_words, is_sweep
from speculator_operator.render import group
from speculator_operator.render.serving import GROUP_SUFFIX, RenderError
from speculator_operator.render.training import (
    SERVER_ROLES,
    Inputs,
    Stage,
    server,
    server_name,
    stages,
    workspace_claim,
)

MAX_MESSAGE = 1500


NO_REPORT = StageReport.model_validate({})  # what a stage that left no report reported


@dataclass
class Observed:
    generation: int
    status: SpeculatorTrainJobStatus
    verifier_layers: int | None = None
    verifier_revision: str | None = None
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads
    verifier_model_type: str | None = None
    verifier_max_positions: int | None = None  # max_position_embeddings, when no rope scaling stretches it
    problem: tuple[str, str] | None = None  # (reason, message) when the verifier could not be read
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> Job
    reports: dict[str, StageReport] = field(default_factory=dict)  # stage -> report of its succeeded pod
    failures: dict[str, str] = field(default_factory=dict)  # stage -> the last failed pod's message (log tail)
    failed_reports: dict[str, StageReport] = field(default_factory=dict)  # stage -> the report that pod left
    stuck: dict[str, tuple[str, str]] = field(default_factory=dict)  # stage -> a stuck pod's (reason, message)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> Deployment or LeaderWorkerSet
    lws_served: bool = True  # whether the API server serves LeaderWorkerSets (a multi-node hiddenStates layout)
    images: dict[str, str] = field(default_factory=dict)  # stage -> the imageID its succeeded pod ran


@dataclass
class Plan:
    apply: list[dict[str, Any]]
    delete: list[tuple[str, str, str]]  # (apiVersion, kind, name)
    status: SpeculatorTrainJobStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)
    handoff: tuple[str, str] | None = None  # (SpeculatorDeployment, checkpoint uri)
    prune: int | None = None  # apply output.keepLatest (keep this many) under output.uri now


def _stop_servers(obs: Observed) -> list[tuple[str, str, str]]:
    """A server's workload (a Deployment, or a LeaderWorkerSet group whose Service has the name without -group)
    and its Service."""
    out = []
    for role, dep in obs.servers.items():
        name = (dep.get("metadata") or {}).get("name") or role
        if dep.get("kind") == group.KIND:
            out += [(group.API_VERSION, group.KIND, name), ("v1", "Service", name.removesuffix(GROUP_SUFFIX))]
        else:
            out += [("apps/v1", "Deployment", name), ("v1", "Service", name)]
    return out


def failed(obs: Observed, reason: str, message: str, fields: dict[str, Any] | None = None, *, now: datetime) -> Plan:
    """The run failed for good (at `now`, the pass's time): `fields` are more status fields (by their Python names)
    to set with it."""
    gen = obs.generation
    status = evolve(
        obs.status, gen,
        make_condition(gen, "Ready", False, reason, message), make_condition(gen, "Failed", True, reason, message),
        phase="Failed", completion_time=obs.status.completion_time or stamp(now), **(fields or {}), now=now,
    )  # fmt: skip
    events = [] if obs.status.phase == "Failed" else [("Warning", reason, message)]
    return Plan([], _stop_servers(obs), status, events)


def job_state(job: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(Pending | Running | Succeeded | Failed, details) of a stage's Job."""
    if job is None:
        return "Pending", {}
    st = job.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or [] if c.get("status") == "True"}
    details: dict[str, Any] = {"startTime": st.get("startTime"), "failures": st.get("failed") or None}
    if "Complete" in conds:
        return "Succeeded", {**details, "completionTime": st.get("completionTime")}
    if "Failed" in conds:
        c = conds["Failed"]
        return "Failed", {**details, "completionTime": c.get("lastTransitionTime"), "reason": c.get("reason"),
                          "message": c.get("message")}  # fmt: skip
    return "Running", details


def server_available(dep: dict[str, Any] | None) -> bool:
    if dep is None:
        return False
    want = (dep.get("spec") or {}).get("replicas", 1)
    st = dep.get("status") or {}
    # a LeaderWorkerSet counts ready groups (it has no availableReplicas)
    available = st.get("readyReplicas") if dep.get("kind") == group.KIND else st.get("availableReplicas")
    return (available or 0) >= max(1, want) and (st.get("observedGeneration") or 0) >= (
        (dep.get("metadata") or {}).get("generation") or 0
    )


def _tail(text: str | None, limit: int = 800) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _progress(spec: SpeculatorTrainJobSpec, obs: Observed) -> Progress:
    """What the finished stages reported, over the running stage's live values (controllers read those from
    its pod's log): a finished stage's estimate of its end goes."""
    prepared = obs.reports.get("prepare", NO_REPORT)
    extracted = obs.reports.get("extract", NO_REPORT)
    trained = obs.reports.get("train", NO_REPORT)
    stored_progress = stored(obs.status.progress) if obs.status.progress is not None else {}
    live = {k: v for k, v in stored_progress.items() if k in progress.LIVE}
    if live.get("stage") in obs.reports:
        live.pop("etaSeconds", None)
    out = {
        **live,
        "samplesTotal": prepared.samples,
        "samplesExtracted": extracted.samples,
        "epoch": trained.epoch if "epoch" in trained.model_fields_set else live.get("epoch"),
        "epochs": spec.training.epochs if spec.convert is None else None,
    }
    return Progress.model_validate({k: v for k, v in out.items() if v is not None})


def _converted_from(spec: SpeculatorTrainJobSpec) -> str | None:
    if spec.convert is None:
        return None
    return f"{spec.convert.source}@{spec.convert.revision}" if spec.convert.revision else spec.convert.source


def _provenance(inputs: Inputs, obs: Observed, all_stages: list[Stage]) -> Provenance:
    r = inputs.release
    # what the kubelet ran: kept from earlier passes, since a finished stage's pods may be gone by now
    images = {**((obs.status.provenance.images if obs.status.provenance else None) or {}), **obs.images}
    return Provenance(
        release=r.name,
        speculators=r.speculators,
        hs_connectors=r.hs_connectors,
        vllm=r.vllm,
        verifier_revision=inputs.verifier_revision,
        verifier_content=inputs.verifier_content,
        verifier_layers=inputs.verifier_layers,
        verifier_model_type=obs.verifier_model_type,
        verifier_max_positions=obs.verifier_max_positions,
        data_fingerprint=obs.reports.get("prepare", NO_REPORT).fingerprint,
        converted_from=_converted_from(inputs.spec),
        evaluation=None if inputs.evaluation is None else EvaluationResult.model_validate(inputs.evaluation),
        commands={s.name: " ".join(s.command) for s in all_stages},
        images=images or None,
    )


def plan(
    name: str,
    namespace: str,
    uid: str | None,
    spec: SpeculatorTrainJobSpec,
    release: Release,
    obs: Observed,
    pull_secrets: tuple[str, ...] = (),
    *,
    now: datetime,
) -> Plan:
    """`pull_secrets`: the imagePullSecrets every rendered pod names (the operator's settings); `now`: the pass's
    time (a start, an end, a condition's transition, how long a server has been waited for)."""
    gen = obs.generation
    current_status = obs.status
    if current_status.phase == "Succeeded" and not obs.servers:
        # a finished run stays finished; only the hand-off may still be due. A failed run is planned
        # again: deleting the failed stage's Job (after fixing the cause) runs that stage again.
        return _finished(name, spec, obs)
    if obs.problem is not None:
        reason, message = obs.problem
        status = evolve(
            current_status, gen, make_condition(gen, "Ready", False, reason, message), phase="Pending", now=now
        )
        return Plan([], [], status, [("Warning", reason, message)])
    assert obs.verifier_layers is not None
    declared = spec.verifier.num_hidden_layers
    if declared is not None and declared != obs.verifier_layers:
        message = (f"verifier.numHiddenLayers is {declared} but {spec.verifier.model}'s config.json has "
                   f"num_hidden_layers {obs.verifier_layers}")  # fmt: skip
        return failed(obs, "InvalidSpec", message, now=now)
    if spec.algorithm == Algorithm.MTP.value and obs.verifier_model_type not in MTP_COUNT_KEY:
        message = (
            f"mtp fine-tunes the verifier's native MTP layers and stitches them back for vLLM to serve with method "
            f"mtp; the verifier's model_type is {obs.verifier_model_type!r}, not one of {', '.join(MTP_COUNT_KEY)}"
        )
        return failed(obs, "InvalidSpec", message, now=now)
    positions = obs.verifier_max_positions
    if spec.data is not None and positions is not None and spec.data.seq_length > positions:
        message = (f"data.seqLength {spec.data.seq_length} exceeds the verifier's max_position_embeddings "
                   f"{obs.verifier_max_positions}: vLLM would refuse the longer samples")  # fmt: skip
        return failed(obs, "InvalidSpec", message, now=now)
    evaluated = evaluation_of(obs)
    passed = evaluated if evaluated and evaluated.get("outcome") == EvaluationOutcome.PASSED else None
    inputs = Inputs(
        name,
        namespace,
        spec,
        release,
        obs.verifier_revision,
        obs.verifier_layers,
        uid,
        obs.verifier_content,
        passed,
        pull_secrets=pull_secrets,
    )
    try:
        all_stages = stages(inputs)
        swept = curve_of(obs.reports, all_stages)
        if swept.problem:
            return failed(obs, SWEEP_FAILED, f"the sweep's points do not make one curve: {swept.problem}", now=now)
        if swept.curve is not None and passed is not None:
            # the curve goes into the published record whole, its summary into status.evaluation
            evaluated = passed = {**passed, "sweep": swept.curve.summary()}
            inputs = replace(inputs, evaluation=passed, sweep=swept.curve.wire())
            all_stages = stages(inputs)
        for role in {s.server for s in all_stages if s.server}:
            server(inputs, role)  # an unrenderable server fails the run now, not when its stage comes
    except RenderError as exc:
        return failed(obs, "InvalidSpec", str(exc), now=now)

    stage_rows: list[dict[str, Any]] = []
    current: Stage | None = None
    current_state, current_details = "Succeeded", {}
    for st in all_stages:
        state, details = job_state(obs.jobs.get(st.name))
        row = {"name": st.name, "phase": state, "job": st.children[0]["metadata"]["name"], **details}
        row.pop("reason", None)
        if state == "Failed":
            row["message"] = _failure_message(st.name, details, obs.failures.get(st.name))
        stage_rows.append({k: v for k, v in row.items() if v is not None})
        if current is None and state != "Succeeded":
            current, current_state, current_details = st, state, details

    fields: dict[str, Any] = {
        "stages": stage_rows,
        "start_time": current_status.start_time or stamp(now),
        "progress": _progress(spec, obs),
        "provenance": _provenance(inputs, obs, all_stages),
    }
    if evaluated:
        fields["evaluation"] = evaluated
    conds = _audit_conditions(gen, obs)
    if current is None:
        return _succeeded(name, spec, obs, fields, conds, now)
    fields["stage"] = current.name
    if current_state == "Failed":
        message = _failure_message(current.name, current_details, obs.failures.get(current.name))
        reason = "AuditFailed" if current.name == "audit" else "StageFailed"
        if current.name == "evaluate" and evaluated and evaluated.get("outcome") in FAILED_EVALUATIONS:
            reason = str(evaluated["outcome"])
            message = f"stage evaluate: {_evaluation_words(evaluated)}; nothing was published"
        if is_sweep(current.name):
            reason = SWEEP_FAILED
            left = obs.failed_reports.get(current.name)
            message = failure_words(current.name, left, message)
            where = failed_at(left)
            if where is not None and evaluated:
                fields["evaluation"] = {**evaluated, "sweep": {"failedAt": where}}
        status = evolve(
            current_status, gen, *conds,
            make_condition(gen, "Ready", False, "StageFailed", message),
            make_condition(gen, "Failed", True, reason, message),
            phase="Failed", completion_time=current_status.completion_time or stamp(now), **fields, now=now,
        )  # fmt: skip
        events = [] if current_status.phase == "Failed" else [("Warning", reason, message)]
        return Plan([], _stop_servers(obs), status, events)

    apply: list[dict[str, Any]] = []
    claim = workspace_claim(inputs)
    if claim and not obs.jobs:
        # applied until the first stage's Job exists (which is applied after it): spec.workspace cannot change,
        # so the claim is not read again on every later pass; one deleted by hand is not made again empty
        # under a run that needs what was in it (its stage pods wait, and the run says why: a stuck pod)
        apply.append(claim)
    delete = [x for role, dep in obs.servers.items() if role != current.server for x in _stop_servers(
        Observed(gen, SpeculatorTrainJobStatus(), servers={role: dep}))]  # fmt: skip
    ready_reason, message = "Running", f"stage {current.name} running"
    exists = obs.jobs.get(current.name) is not None
    if current.server and spec.hidden_states.layout.multi_node and not obs.lws_served:
        ready_reason = ServingReason.LWS_UNAVAILABLE.value
        message = (f"stage {current.name}'s vLLM server spans {spec.hidden_states.layout.nodes} nodes, which needs the "
                   f"LeaderWorkerSet API; {group.INSTALL_HINT}")  # fmt: skip
    elif current.server:
        apply += server(inputs, current.server)
        late = _server_late(spec, obs, current, now) or _still_late(obs, current, exists)
        if late and is_sweep(current.name):
            bound = "evaluation.sweep.timeoutSeconds"
            words = late.get("message") or _late_words(server_name(name, current.server), late, current.name, bound)
            return failed(obs, SWEEP_FAILED, str(words), fields, now=now)
        if late:
            words = _late_words(server_name(name, current.server), late)
            return failed(obs, EvaluationOutcome.SERVER_NOT_READY, words, {**fields, "evaluation": late}, now=now)
        if not exists and not server_available(obs.servers.get(current.server)):
            ready_reason = "WaitingForServer"
            message = f"stage {current.name} waits for its vLLM server {server_name(name, current.server)}"
            for row in stage_rows:
                if row["name"] == current.name:
                    row["message"] = message
    if not exists and ready_reason == "Running":
        # a Job's pod template is immutable: it is created once and then only observed
        apply += current.children
    if exists and current.name in obs.stuck:
        ready_reason, problem = obs.stuck[current.name]
        message = f"stage {current.name}: {problem}"
        for row in stage_rows:
            if row["name"] == current.name:
                row["message"] = message
    # While a stage runs the run has no Ready condition (kstatus reads Ready=False as InProgress; a started run is
    # Current, as kstatus treats a started Job: planning/health.py); Failed=False says what the stage is doing.
    unready = [c for c in current_status.conditions if c.type != "Ready"]
    status = evolve(
        evolve(current_status, None, conditions=unready), gen, *conds,
        make_condition(gen, "Failed", False, ready_reason, message),
        phase=current.phase, completion_time=None, **fields, now=now,
    )  # fmt: skip
    events = []
    if current_status.phase == "Failed":
        events.append(("Normal", "Resumed", f"stage {current.name} runs again"))
    elif current_status.stage != current.name:
        events.append(("Normal", "StageStarted", f"stage {current.name}"))
    return Plan(apply, delete, status, events)


def evaluation_of(obs: Observed) -> dict[str, Any] | None:
    """What the evaluate stage measured: its succeeded pod's report, else the report its last failed pod left
    as its termination message (exit code 3: the draft fell below its bounds)."""
    found = obs.reports.get("evaluate") or obs.failed_reports.get("evaluate")
    value = found.evaluation if found is not None else None
    return value if isinstance(value, dict) else None


def _evaluation_words(ev: dict[str, Any]) -> str:
    outcome = ev.get("outcome")
    if outcome == EvaluationOutcome.ZERO_DRAFTS:
        return f"vLLM made no drafts over {ev.get('prompts', '?')} prompt(s): it served without speculation"
    if outcome == EvaluationOutcome.SERVER_NOT_READY:
        return "the evaluation server was not ready within evaluation.timeoutSeconds"
    said = f"acceptance {ev.get('rate')} (mean accepted length {ev.get('meanAcceptedLength')}, K={ev.get('k')}"
    said += f", {ev.get('drafts')} drafts over {ev.get('tokens')} tokens"
    if ev.get("predictedSpeedup") is not None:
        said += f", predicted speedup {ev['predictedSpeedup']}"
    bounds = [f"{k} {ev[k]}" for k in ("minAcceptance", "minSpeedup") if k in ev]
    return said + ") is below " + " / ".join(bounds or ["its bound"])


def _server_late(spec: SpeculatorTrainJobSpec, obs: Observed, stage: Stage, now: datetime) -> dict[str, Any] | None:
    """The evaluation (outcome EvaluationServerNotReady, how long it waited) once it has waited too long for its
    server; None while within evaluation.timeoutSeconds, counted from the server's creation to `now` (the client Job
    is bounded by the same limit once it runs)."""
    if spec.evaluation is None or obs.jobs.get(stage.name) is not None:
        return None
    if stage.name == "evaluate":
        limit = spec.evaluation.timeout_seconds
    elif is_sweep(stage.name) and spec.evaluation.sweep is not None:
        limit = spec.evaluation.sweep.timeout_seconds
    else:
        return None
    dep = obs.servers.get(stage.server or "")
    created = ((dep or {}).get("metadata") or {}).get("creationTimestamp")
    if not created or server_available(dep):
        return None
    try:
        since = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return None
    waited = int((now - since).total_seconds())
    if waited <= limit:
        return None
    return {"outcome": EvaluationOutcome.SERVER_NOT_READY.value, "serverWaitSeconds": waited, "timeoutSeconds": limit}


def _still_late(obs: Observed, stage: Stage, exists: bool) -> dict[str, Any] | None:
    """A run failed because its evaluation server never became ready stays failed (its server is gone, so
    nothing else would hold it) until its spec changes, e.g. a longer evaluation.timeoutSeconds: the evaluation
    it stored says so. A run that fe501e0 failed so stored only the Failed condition's reason (read as the enum:
    the run is not started again on an upgrade). A sweep stage whose server was never ready stays failed the same
    way (its Failed reason SweepFailed, its stage the run's)."""
    if exists or obs.status.phase != "Failed" or obs.status.observed_generation != obs.generation:
        return None
    if is_sweep(stage.name) and obs.status.stage == stage.name:
        failed_ = conditions_of(obs.status).get("Failed")
        if failed_ is None or failed_.reason != SWEEP_FAILED:
            return None
        return {"outcome": SWEEP_FAILED, "message": failed_.message}  # said as it was: no write
    if stage.name != "evaluate":
        return None
    evaluation = obs.status.evaluation
    if evaluation is not None and evaluation.outcome == EvaluationOutcome.SERVER_NOT_READY:
        return stored(evaluation)
    failed_ = conditions_of(obs.status).get("Failed")
    if evaluation is None and failed_ is not None and failed_.reason == EvaluationOutcome.SERVER_NOT_READY:
        return {"outcome": EvaluationOutcome.SERVER_NOT_READY.value}
    return None


def _late_words(
    server: str, evaluation: dict[str, Any], stage: str = "evaluate", field_name: str = "evaluation.timeoutSeconds"
) -> str:
    waited = evaluation.get("serverWaitSeconds")
    when = f"{waited} s after it was created" if waited is not None else "in time"
    limit = evaluation.get("timeoutSeconds")
    bound = f" ({field_name} {limit})" if limit is not None else ""
    return f"stage {stage}: its vLLM server {server} was not ready {when}{bound}; nothing was published"


def _failure_message(stage: str, details: dict[str, Any], tail: str | None) -> str:
    message = f"stage {stage} failed ({details.get('reason') or 'Failed'}): {details.get('message') or ''}".rstrip()
    if tail:
        message += f"; last pod: {_tail(tail)}"
    return message[:MAX_MESSAGE]


def _audit_conditions(gen: int, obs: Observed) -> list[Condition]:
    report = obs.reports.get("audit")
    if report is not None:
        return [make_condition(gen, "Audited", True, "AuditPassed", "the trained checkpoint passed the audit")]
    if "audit" in obs.failures:
        return [make_condition(gen, "Audited", False, "AuditFailed", _tail(obs.failures["audit"]))]
    return []


def _succeeded(
    name: str,
    spec: SpeculatorTrainJobSpec,
    obs: Observed,
    fields: dict[str, Any],
    conds: list[Condition],
    now: datetime,
) -> Plan:
    gen = obs.generation
    published = obs.reports.get("publish", NO_REPORT)
    checkpoint = {"uri": published.uri or spec.output.uri, "digest": published.digest}
    audit = obs.reports.get("audit", NO_REPORT).audit
    message = f"published {checkpoint['uri']}" + (f" ({checkpoint['digest']})" if checkpoint["digest"] else "")
    status = evolve(
        obs.status, gen, *conds,
        make_condition(gen, "Published", True, "Published", message),
        make_condition(gen, "Ready", True, "Succeeded", message),
        make_condition(gen, "Failed", False, "Succeeded", message),
        phase="Succeeded", stage=None, completion_time=obs.status.completion_time or stamp(now),
        checkpoint={k: v for k, v in checkpoint.items() if v}, audit=audit, **fields, now=now,
    )  # fmt: skip
    events = [] if obs.status.phase == "Succeeded" else [("Normal", "Succeeded", message)]
    handoff = None
    if spec.deploy_to and obs.status.deployed_to != spec.deploy_to:
        handoff = (spec.deploy_to, str(checkpoint["uri"]))
    return Plan([], _stop_servers(obs), status, events, handoff, _prune(spec, status))


def _finished(name: str, spec: SpeculatorTrainJobSpec, obs: Observed) -> Plan:
    status = obs.status
    handoff = None
    if spec.deploy_to and status.deployed_to != spec.deploy_to:
        published = status.checkpoint.uri if status.checkpoint else None
        handoff = (spec.deploy_to, published or spec.output.uri)
    return Plan([], [], status, [], handoff, _prune(spec, status))


def _prune(spec: SpeculatorTrainJobSpec, status: SpeculatorTrainJobStatus) -> int | None:
    keep = spec.output.keep_latest
    return keep if keep is not None and retention_due(keep, spec.output.uri, stored(status)) else None


def handed_off(
    status: SpeculatorTrainJobStatus, generation: int, target: str, reason: HandOff, message: str, *, now: datetime
) -> SpeculatorTrainJobStatus:
    """The status after a hand-off attempt to `target` (at `now`, the pass's time)."""
    ok = reason in (HandOff.OFFERED, HandOff.PATCHED, HandOff.FOLLOWING)
    return evolve(status, generation, make_condition(generation, "HandedOff", ok, reason, message),
                  deployed_to=target if ok else status.deployed_to, now=now)  # fmt: skip


def retained(status: SpeculatorTrainJobStatus, retention: Retention) -> SpeculatorTrainJobStatus:
    """The status once output.keepLatest has been applied (what was deleted and what was kept)."""
    return evolve(status, None, retention=retention)


def resync_due(spec: dict[str, Any], status: dict[str, Any]) -> bool:
    """Whether the periodic resync has anything to do: a run in flight (a missed child event must not
    stall it), a hand-off target that may appear later, or output.keepLatest not yet applied. A failed
    run moves again on its failed Job's deletion (a child event), not here."""
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return True
    if status.get("deployedTo") != spec.get("deployTo"):
        return True
    output = spec.get("output") or {}
    return phase == "Succeeded" and retention_due(output.get("keepLatest"), str(output.get("uri") or ""), status)


def wakes_owner(event_type: str | None, child: dict[str, Any]) -> bool:
    """Whether a child's event can move the stage machine: a stage Job finished, a server became
    available, or a child went away. Pods starting and counters moving change nothing it decides on."""
    if event_type == "DELETED":
        return True
    status = child.get("status") or {}
    terminal = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in status.get("conditions") or [])  # fmt: skip
    return terminal or (status.get("availableReplicas") or 0) >= 1


class HandOff(StrEnum):
    """The HandedOff condition's reasons (the hand-off's outcome; decisions read them only as these). `Patched` was
    written by operators before the hand-off moved into the deployment's status; it is read as a success."""

    OFFERED = "Offered"
    PATCHED = "Patched"
    FOLLOWING = "Following"
    TARGET_MISSING = "TargetMissing"


def handoff_offer(sdep: dict[str, Any] | None, job: str, target: str, uri: str) -> tuple[HandOff, str]:
    """(reason, message) of the hand-off of `job`'s published `uri` to the SpeculatorDeployment `target` (the stored
    object, None if missing). Nothing is written to the deployment: it takes the output into its own status
    (planning/handover.py), so that a GitOps tool re-applying its manifests undoes nothing."""
    if sdep is None:
        return HandOff.TARGET_MISSING, f"SpeculatorDeployment {target!r} does not exist (yet)"
    if ((sdep.get("spec") or {}).get("speculator") or {}).get("fromTrainJob") == job:
        return HandOff.FOLLOWING, f"SpeculatorDeployment {target} serves this job's output (speculator.fromTrainJob)"
    return HandOff.OFFERED, f"SpeculatorDeployment {target} takes {uri} into its status.handedOver (no spec is written)"


__all__ = [
    "SERVER_ROLES", "HandOff", "Observed", "Plan", "failed", "handed_off", "handoff_offer", "job_state", "plan",
    "resync_due", "wakes_owner",
]  # fmt: skip
