"""The two kinds' work queues (runtime/controller.py), in a module of their own so that every trigger can
enqueue a key without importing the controller whose pass handles it (the telemetry loop enqueues
deployments; a train job's publish enqueues the deployment it feeds). Which causes are quick:
planning/passes.py."""

from __future__ import annotations

from speculator_operator.planning.passes import DEPLOYMENT_QUICK, TRAINJOB_QUICK
from speculator_operator.runtime.controller import Controller

# their pools come from the settings the operator starts with (runtime/settings.py)
DEPLOYMENTS = Controller("SpeculatorDeployment", quick=DEPLOYMENT_QUICK, pools=lambda s: (s.workers, s.quick_workers))
TRAINJOBS = Controller(
    "SpeculatorTrainJob", quick=TRAINJOB_QUICK, pools=lambda s: (s.workers, s.trainjob_quick_workers)
)
