"""What a train job's stage pods say, read into its observations (pure: the pods come from the caller's list):
the reports the succeeded ones left, the last failure's words and the report it left, a stuck pod's problem,
and the image each stage ran. The reports are read from the termination message as the pod wrote it
(api/podcontract.py), never back out of text the operator composed."""

from __future__ import annotations

from typing import Any

from speculator_operator.api.labels import STAGE_LABEL
from speculator_operator.api.podcontract import StageReport
from speculator_operator.planning.pods import pod_problem, terminated_words
from speculator_operator.planning.trainjob import Observed

MAIN = "main"


def main_terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The main container's `terminated` state (its last one if it restarted), or None."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != MAIN:
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            return dict(term)
    return None


def failure_words(term: dict[str, Any]) -> str | None:
    """A failed container's words for the run's message: the kubelet's reason and the exit code first
    (`OOMKilled (exit code 137): ...`), then what it wrote."""
    message = term.get("message")
    if term.get("exitCode"):
        return f"{terminated_words(term)}: {message or ''}".rstrip(": ")
    return str(message) if message else None


def main_image_id(pod: dict[str, Any]) -> str | None:
    """The image the kubelet ran for the pod's main container (repository@digest), if it reports one."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == MAIN and cs.get("imageID"):
            return str(cs["imageID"])
    return None


def observe_pods(obs: Observed, pods: list[dict[str, Any]]) -> set[str]:
    """What the stage pods say into `obs`; returns the stages that have pods."""
    latest_fail: dict[str, str] = {}
    with_pods: set[str] = set()
    for pod in pods:
        stage = (pod["metadata"].get("labels") or {}).get(STAGE_LABEL)
        phase = (pod.get("status") or {}).get("phase")
        if stage not in obs.jobs:
            continue
        with_pods.add(stage)
        if phase not in ("Succeeded", "Failed"):
            problem = pod_problem(pod)
            if problem:
                obs.stuck.setdefault(stage, problem)
            continue
        term = main_terminated(pod) or {}
        if phase == "Succeeded":
            image_id = main_image_id(pod)
            if image_id:
                obs.images[stage] = image_id
            found = StageReport.decode(term.get("message"))
            if found is not None:
                before = obs.reports.get(stage)
                obs.reports[stage] = before.merged(found) if before is not None else found
            continue
        words = failure_words(term)
        finished = str(term.get("finishedAt") or "")
        if words and finished >= latest_fail.get(stage, ""):
            latest_fail[stage] = finished
            obs.failures[stage] = words
            report = StageReport.decode(term.get("message"))
            if report is not None:
                obs.failed_reports[stage] = report
            else:
                obs.failed_reports.pop(stage, None)
    return with_pods
