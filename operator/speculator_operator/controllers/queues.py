"""The two kinds' work queues (runtime/controller.py), in a module of their own so that every trigger can
enqueue a key without importing the controller whose pass handles it (the telemetry loop enqueues
deployments; a train job's publish enqueues the deployment it feeds)."""

from __future__ import annotations

from speculator_operator.runtime.controller import Controller
from speculator_operator.runtime.kube import HANDLER_WORKERS

DEPLOYMENTS = Controller("SpeculatorDeployment", HANDLER_WORKERS)
TRAINJOBS = Controller("SpeculatorTrainJob", HANDLER_WORKERS)
