"""Checkpoints read header-only from a folder, s3:// or hf://, and the audit that gates serving them."""

from speculator_operator.domain.checkpoint.audit import AuditReport, audit
from speculator_operator.domain.checkpoint.manifest import Manifest
from speculator_operator.domain.checkpoint.model import (
    Checkpoint,
    CheckpointError,
    VerifierRef,
    checkpoint_dir,
    load_checkpoint,
    load_served,
    load_verifier_config,
    read_verifier,
)
from speculator_operator.domain.checkpoint.rules import RULES, Finding, Severity
from speculator_operator.domain.checkpoint.sources import SourceError, open_source

__all__ = [
    "RULES",
    "AuditReport",
    "Checkpoint",
    "CheckpointError",
    "Finding",
    "Manifest",
    "Severity",
    "SourceError",
    "VerifierRef",
    "audit",
    "checkpoint_dir",
    "load_checkpoint",
    "load_served",
    "load_verifier_config",
    "open_source",
    "read_verifier",
]
