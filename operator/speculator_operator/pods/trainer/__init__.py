"""What runs inside a SpeculatorTrainJob's pods (the trainer image): `speculator-operator trainer ...`, one module
per stage command: fetch, run (every tool stage: regenerate, prepare, extract, train, convert, stitch), audit,
publish; report.py is what they share (the stage report of the pod contract). The evaluate stage's client is
pods/evaluate.py."""

from speculator_operator.pods.trainer.audit import audit_checkpoint
from speculator_operator.pods.trainer.fetch import fetch
from speculator_operator.pods.trainer.publish import location_name, publish
from speculator_operator.pods.trainer.report import report
from speculator_operator.pods.trainer.run import PROGRESS_SECONDS, causal_as_trained, run

__all__ = [
    "PROGRESS_SECONDS",
    "audit_checkpoint",
    "causal_as_trained",
    "fetch",
    "location_name",
    "publish",
    "report",
    "run",
]
