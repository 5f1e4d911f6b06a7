"""`trainer audit CKPT --verifier DIR [--release R]`: audit the trained checkpoint with the audit core; exit 1 on
errors, 2 when it cannot be read."""

from __future__ import annotations

import sys
from pathlib import Path

from speculator_operator.adapters.checkpoints import audit, checkpoint_dir, load_verifier_config
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.releases import pod_release
from speculator_operator.pods.trainer.report import report


def audit_checkpoint(root: str, verifier: str, release_name: str | None) -> int:
    try:
        folder = checkpoint_dir(Path(root))
        verifier_config, _ = load_verifier_config(verifier)
        release = pod_release(release_name) if release_name else None
        result = audit(str(folder), verifier=verifier_config, release=release)
    except CheckpointError as exc:
        print(f"trainer audit: {exc}", file=sys.stderr)
        return 2
    for f in result.findings:
        print(f"audit {f.severity} {f.rule}: {f.message}", file=sys.stderr)
    findings = [f.as_dict() for f in result.findings if f.severity != "info"]
    warnings = sum(1 for f in result.findings if f.severity == "warning")
    summary = {"ok": result.ok, "errors": len(result.errors), "warnings": warnings, "findings": findings[:20]}
    if not result.ok:
        first = result.errors[0]
        # the termination message of a failed pod: the operator quotes it in the status
        print(f"audit failed: {len(result.errors)} error(s); first: {first.rule}: {first.message}", file=sys.stderr)
        return 1
    report("audit", checkpoint=str(folder), audit=summary, algorithm=result.checkpoint.algorithm)
    return 0
