"""Audit a checkpoint against its verifier and the pinned vLLM: the gate before anything is served."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from speculator_operator.domain.checkpoint import stitched
from speculator_operator.domain.checkpoint.model import Checkpoint, read_checkpoint
from speculator_operator.domain.checkpoint.rules import AuditContext, Finding, Severity, declared_draft, run_rules
from speculator_operator.domain.checkpoint.sources import Source
from speculator_operator.domain.releases import Release, Version


@dataclass
class AuditReport:
    checkpoint: Checkpoint
    findings: list[Finding]
    release: Release | None = None
    vllm: Version | None = None
    verifier_revision: str | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    def as_dict(self) -> dict[str, Any]:
        summary = self.checkpoint.summary()
        summary["verifier_revision"] = self.verifier_revision
        return {
            "ok": self.ok,
            "checkpoint": summary,
            "release": None if self.release is None else self.release.name,
            "vllm": None if self.vllm is None else str(self.vllm),
            "findings": [f.as_dict() for f in self.findings],
            **self.extra,
        }


def audit(
    checkpoint: Source | Checkpoint,
    *,
    verifier: dict[str, Any] | None = None,
    verifier_revision: str | None = None,
    verifier_content: str | None = None,
    served_verifier: str | None = None,
    release: Release | None = None,
    vllm: Version | None = None,
    allow_lossy: bool = False,
    deep: bool = False,
    speculative_tokens: int | None = None,
    declared: tuple[str | None, int | None] = (None, None),
) -> AuditReport:
    """Run every audit rule (a stitched MTP model's own: checkpoint/stitched.py; `speculative_tokens` is the K
    it is to be served with; `declared` the algorithm and speculative_tokens the deployment expects). A source is
    read here, header only (the shell opens a location: adapters/checkpoints.py). Raises CheckpointError only when
    the checkpoint cannot be read at all."""
    t0 = time.perf_counter()
    ck = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    pinned = vllm if vllm is not None else (release.vllm_version if release is not None else None)
    ctx = AuditContext(
        checkpoint=ck,
        verifier=verifier,
        served_verifier=served_verifier,
        verifier_revision=verifier_revision,
        verifier_content=verifier_content,
        vllm=pinned,
        allow_lossy=allow_lossy,
        deep=deep,
        declared=declared,
    )
    if ck.stitched_mtp:
        findings = stitched.findings(ctx, speculative_tokens)
        findings += [m if isinstance(m, Finding) else Finding("declared-draft", Severity.ERROR, m)
                     for m in declared_draft(ctx)]  # fmt: skip
    else:
        findings = run_rules(ctx)
    if verifier is None:
        findings.append(
            Finding(
                "verifier-compatibility",
                Severity.INFO,
                "no verifier given: hidden size, vocabulary and layer "
                "ids were not checked against it (pass --verifier or --verifier-config)",
            )
        )
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    findings.sort(key=lambda f: order[f.severity])
    return AuditReport(
        checkpoint=ck,
        findings=findings,
        release=release,
        vllm=pinned,
        verifier_revision=verifier_revision,
        seconds=time.perf_counter() - t0,
    )
