"""Checkpoints read header-only through a source (a folder, s3:// or hf://, opened by the shell:
adapters/checkpoints.py), and the audit that gates serving them."""

from speculator_operator.domain.checkpoint.audit import AuditReport, audit
from speculator_operator.domain.checkpoint.manifest import Manifest
from speculator_operator.domain.checkpoint.model import (
    Checkpoint,
    CheckpointError,
    VerifierRef,
    read_checkpoint,
    read_verifier_ref,
)
from speculator_operator.domain.checkpoint.rules import RULES, Finding, Severity
from speculator_operator.domain.checkpoint.sources import Source, SourceError

__all__ = [
    "RULES",
    "AuditReport",
    "Checkpoint",
    "CheckpointError",
    "Finding",
    "Manifest",
    "Severity",
    "Source",
    "SourceError",
    "VerifierRef",
    "audit",
    "read_checkpoint",
    "read_verifier_ref",
]
