"""The two kinds' work queues (runtime/controller.py), in a module of their own so that every trigger can
enqueue a key without importing the controller whose pass handles it (the telemetry loop enqueues
deployments; a train job's publish enqueues the deployment it feeds)."""

from __future__ import annotations

from speculator_operator.runtime.controller import Controller
from speculator_operator.runtime.kube import HANDLER_WORKERS, QUICK_WORKERS

# quick causes: a pass that only folds in what a child, a scrape or a log said (no audit, no checkpoint read);
# measured at 1,000 new SpeculatorDeployments, a child's readiness otherwise waited behind the others' audits
DEPLOYMENTS = Controller(
    "SpeculatorDeployment", HANDLER_WORKERS, frozenset({"child", "resync", "scrape"}), QUICK_WORKERS
)
TRAINJOBS = Controller("SpeculatorTrainJob", HANDLER_WORKERS, frozenset({"child", "resync", "progress"}), QUICK_WORKERS)
