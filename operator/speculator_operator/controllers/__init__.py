"""The kopf adapters: one pass per kind (deployment, trainjob) and the loops beside them (telemetry scrapes,
retention prunes); each pass observes, asks a planner, has the executor write and writes status once. Every
watch is declared in watches.py. `speculator-operator run` starts them with the settings it read (`start`); a bare
`kopf run -m speculator_operator.controllers` reads the settings at its start-up."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from speculator_operator.api.labels import MANAGED_BY_LABEL
from speculator_operator.controllers import watches  # noqa: F401  (registers the handlers)
from speculator_operator.domain import images
from speculator_operator.render.serving import MANAGED_BY
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime import settings as operator_settings

# the kinds of the operator's children it watches (group, plural; all at v1)
CHILD_KINDS = (
    ("", "pods"),
    ("", "services"),
    ("apps", "deployments"),
    ("batch", "jobs"),
    ("policy", "poddisruptionbudgets"),
)


def start(settings: operator_settings.Settings) -> None:
    """The settings the controllers run with (read once, by runtime/entry.py, or by a test that starts them in
    its own process): kopf's start-up handlers size and time the work queues and the periodic jobs from them."""
    operator_settings.install(settings)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account; elsewhere: the KUBECONFIG read now (not at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    started = operator_settings.at_start()  # a malformed setting stops a bare `kopf run` here
    images.use(started.images())  # what the rendered pods' images are, from now on
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
    settings.queueing.idle_timeout = started.idle_worker_seconds
    # every handler is a coroutine; the passes run on the kinds' work queues (runtime/controller.py)
    settings.execution.max_workers = 4
    # the operator's own /metrics: acceptance per deployment, scrape outcomes (telemetry.py), its work
    metrics.serve(started.metrics_port, started.metrics_address)
    metrics.LEADER.set(1)
    kube.load_config()


def watch_only_children(settings: kopf.OperatorSettings) -> None:
    """The child kinds' handlers take only the operator's own (by label): asked of the API server, not only
    filtered by kopf once decoded, or every pod, Deployment, Service, PDB and Job in the cluster comes over
    the watch, is decoded, and waits in its object's queue to be dropped."""
    for group, plural in CHILD_KINDS:
        settings.watching.label_selectors[group, "v1", plural] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
