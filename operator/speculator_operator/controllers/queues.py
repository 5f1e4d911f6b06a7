"""The two kinds' work queues (runtime/controller.py), in a module of their own so that every trigger can
enqueue a key without importing the controller whose pass handles it (the telemetry loop enqueues
deployments; a train job's publish enqueues the deployment it feeds). Which causes are quick:
planning/passes.py."""

from __future__ import annotations

from speculator_operator.planning.passes import DEPLOYMENT_QUICK, TRAINJOB_QUICK
from speculator_operator.runtime.controller import Controller
from speculator_operator.runtime.kube import HANDLER_WORKERS, QUICK_WORKERS, TRAINJOB_QUICK_WORKERS

DEPLOYMENTS = Controller("SpeculatorDeployment", HANDLER_WORKERS, DEPLOYMENT_QUICK, QUICK_WORKERS)
TRAINJOBS = Controller("SpeculatorTrainJob", HANDLER_WORKERS, TRAINJOB_QUICK, TRAINJOB_QUICK_WORKERS)
