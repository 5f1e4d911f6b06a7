"""What the kubelet says about a pod that cannot make progress, in its own words, so that a resource
shows it (a condition, a stage's message) instead of a silent Deploying or Running: an image it cannot
get, a container it cannot create, one that keeps crashing, one the kernel killed for memory, a pod no
node can take; and where a vLLM server left its exit record (api/podcontract.py `ServerExit`), that record's
reason (NoAccelerator, EngineExited, DraftAuditFailed) instead of the kubelet's CrashLoopBackOff."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from speculator_operator.api.podcontract import ExitCode, ServerExit


class ImageReason(StrEnum):
    """The kubelet's waiting reasons for an image it cannot get: nothing changes until the image or the spec does."""

    ERR_IMAGE_PULL = "ErrImagePull"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    INVALID_IMAGE_NAME = "InvalidImageName"
    ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"


# waiting reasons that do not resolve themselves
STUCK = frozenset({
    *ImageReason, "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff", "RunContainerError",
    "PreCreateHookError",
})  # fmt: skip
MAX_MESSAGE = 600
START_REFUSED = "StartRefused"  # a container exited with ExitCode.USAGE and said why (its termination message)


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    st = pod.get("status") or {}
    return [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]


def terminated_words(term: dict[str, Any]) -> str:
    """`OOMKilled (exit code 137)`, `Error (exit code 2)`: a terminated container's reason and code."""
    reason = term.get("reason") or "Terminated"
    code = term.get("exitCode")
    return f"{reason} (exit code {code})" if code is not None else str(reason)


def server_exit(name: str, container: str, term: dict[str, Any], kubelet: str = "") -> tuple[str, str] | None:
    """(reason, message) from a terminated server container's exit record, or None when it left none: its words,
    then as much of the end of vLLM's output as fits (where the error is)."""
    record = ServerExit.decode(term.get("message"))
    if record is None:
        return None
    words, _, output = record.message.partition("\n")
    said = f"pod {name}, container {container}: {words}{kubelet}"
    room = MAX_MESSAGE - len(said) - 2
    if output and room > 40:
        said += "\n…" + output[-room:]
    return record.reason.value, said[:MAX_MESSAGE]


def pod_problem(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the pod is stuck; None while it is fine or still starting."""
    name = (pod.get("metadata") or {}).get("name", "pod")
    for cs in _statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        last = (cs.get("lastState") or {}).get("terminated")
        if reason == "CrashLoopBackOff" and last:
            exited = server_exit(name, str(cs.get("name")), last, f" ({reason}, last: {terminated_words(last)})")
            if exited:
                return exited
        if reason in STUCK:
            message = f"pod {name}, container {cs.get('name')}: {reason}: {waiting.get('message') or ''}".rstrip(": ")
            if last:
                message += f" (last: {terminated_words(last)})"
            return str(reason), message[:MAX_MESSAGE]
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("exitCode") and (exited := server_exit(name, str(cs.get("name")), term)):
            return exited
        if term.get("exitCode") == ExitCode.USAGE and term.get("message"):
            # the entrypoint refused to start (a group variable missing, an unreadable input): its own words; a group
            # that restarts as a unit recreates the pod before the kubelet ever says CrashLoopBackOff
            said = f"pod {name}, container {cs.get('name')}: {term['message']}"
            return START_REFUSED, said[:MAX_MESSAGE]
        if term.get("reason") == "OOMKilled":
            return "OOMKilled", f"pod {name}, container {cs.get('name')}: {terminated_words(term)}"[:MAX_MESSAGE]
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
            return str(cond["reason"]), f"pod {name}: {cond.get('message') or cond['reason']}"[:MAX_MESSAGE]
    return None


def first_problem(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The first stuck pod's (reason, message), by pod name: the same answer for the same pods."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        found = pod_problem(pod)
        if found:
            return found
    return None


def refused_creation(job_name: str, events: list[dict[str, Any]]) -> tuple[str, str] | None:
    """("FailedCreate", the API server's words) from a Job's FailedCreate events, the latest one: the Job
    controller could not create its pod (Pod Security admission, a quota) and says so only there."""
    failed = [e for e in events if e.get("reason") == "FailedCreate"]
    if not failed:
        return None
    latest = max(failed, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or
                                          (e.get("metadata") or {}).get("creationTimestamp") or ""))  # fmt: skip
    return "FailedCreate", f"job {job_name}: {latest.get('message') or ''}"[:MAX_MESSAGE]
