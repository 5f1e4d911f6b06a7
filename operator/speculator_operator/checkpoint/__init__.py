"""Checkpoints read header-only from a folder, s3:// or hf://, and the audit that gates serving them."""

from speculator_operator.checkpoint.audit import AuditReport, audit
from speculator_operator.checkpoint.model import Checkpoint, CheckpointError, load_checkpoint, load_verifier_config
from speculator_operator.checkpoint.rules import RULES, Finding, Severity
from speculator_operator.checkpoint.sources import SourceError, open_source

__all__ = [
    "RULES",
    "AuditReport",
    "Checkpoint",
    "CheckpointError",
    "Finding",
    "Severity",
    "SourceError",
    "audit",
    "load_checkpoint",
    "load_verifier_config",
    "open_source",
]
