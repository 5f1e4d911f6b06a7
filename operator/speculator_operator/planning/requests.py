"""One-shot requests on a SpeculatorDeployment: an annotation whose new value asks for something once (resolve the
revisions now, retrain now, roll out a paused change). A user sets it with `kubectl annotate`, or Argo CD's resource
actions do (gitops/argocd). The operator never writes the annotation: it compares its value with the one recorded
in `status.requests` and acts when they differ, then records it, in the same pass and the same status write. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from speculator_operator.api.common import evolve
from speculator_operator.api.deployment import Requests, SpeculatorDeploymentStatus
from speculator_operator.api.labels import (
    RESOLVE_REQUEST_ANNOTATION,
    RESUME_REQUEST_ANNOTATION,
    RETRAIN_REQUEST_ANNOTATION,
)


class Request(StrEnum):
    RESOLVE = "resolve"
    RETRAIN = "retrain"
    RESUME = "resume"


ANNOTATIONS = {
    Request.RESOLVE: RESOLVE_REQUEST_ANNOTATION,
    Request.RETRAIN: RETRAIN_REQUEST_ANNOTATION,
    Request.RESUME: RESUME_REQUEST_ANNOTATION,
}


def pending(annotations: Mapping[str, str] | None, handled: Mapping[str, object] | None) -> dict[Request, str]:
    """The requests whose annotation holds a value other than the one last acted on: request -> value. `handled` is
    status.requests as stored (camelCase keys are the same as the Python names here)."""
    out = {}
    for request, key in ANNOTATIONS.items():
        value = (annotations or {}).get(key)
        if value and value != (handled or {}).get(request.value):
            out[request] = value
    return out


def acted(status: SpeculatorDeploymentStatus, done: Mapping[Request, str]) -> SpeculatorDeploymentStatus:
    """The status with the requests acted on in this pass recorded."""
    if not done:
        return status
    current = status.requests or Requests()
    return evolve(status, None, requests=current.model_copy(update={r.value: v for r, v in done.items()}))
