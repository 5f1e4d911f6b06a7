"""The kopf adapters: one pass per kind (deployment, trainjob) and the loops beside them (telemetry scrapes,
retention prunes); each pass observes, asks a planner, has the executor write and writes status once. Every
watch is declared in watches.py. `kopf run -m speculator_operator.controllers`
(or `speculator-operator run`) starts them."""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from speculator_operator.api.labels import MANAGED_BY_LABEL
from speculator_operator.controllers import watches  # noqa: F401  (registers the handlers)
from speculator_operator.render.serving import MANAGED_BY
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import settings as operator_settings

# how long kopf's worker for one object waits for its next event before it exits (kopf's default is 5 s)
IDLE_WORKER_SECONDS = float(os.environ.get("SPECULATOR_IDLE_WORKER_SECONDS", "0.5"))
# the kinds of the operator's children it watches (group, plural; all at v1)
CHILD_KINDS = (
    ("", "pods"),
    ("", "services"),
    ("apps", "deployments"),
    ("batch", "jobs"),
    ("policy", "poddisruptionbudgets"),
)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account; elsewhere: the KUBECONFIG read now (not at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    operator_settings.load()  # the operator's own settings, read once (a malformed one stops the start here)
    # handler state lives in our own annotations; only warnings become Events (each Event is a write)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="speculators.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="speculators.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 270
    watch_only_children(settings)
    # kopf's worker for one object keeps its last event (the whole decoded body, managedFields and all) until it
    # has idled this long; at 5 s (kopf's default) some hundreds of them held their bodies at once under a burst,
    # and what they freed left Python's arenas fragmented (docs/performance/README.md). A later event starts a
    # new worker: the handlers here only enqueue, so nothing waits on one.
    settings.queueing.idle_timeout = IDLE_WORKER_SECONDS
    # every handler is a coroutine; the passes run on the kinds' work queues (runtime/controller.py)
    settings.execution.max_workers = 4
    # the operator's own /metrics: acceptance per deployment, scrape outcomes (telemetry.py), its work
    metrics.serve()
    metrics.LEADER.set(1)
    kube.load_config()


def watch_only_children(settings: kopf.OperatorSettings) -> None:
    """The child kinds' handlers take only the operator's own (by label): asked of the API server, not only
    filtered by kopf once decoded, or every pod, Deployment, Service, PDB and Job in the cluster comes over
    the watch, is decoded, and waits in its object's queue to be dropped."""
    for group, plural in CHILD_KINDS:
        settings.watching.label_selectors[group, "v1", plural] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
