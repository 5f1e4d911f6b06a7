"""What every trainer stage shares: the report it leaves for the operator (the pod contract's StageReport,
written where the kubelet reads the termination message) and the reading of its rendered command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from speculator_operator.api.podcontract import StageReport, report_path


def report(stage: str, **fields: Any) -> None:
    """Write the stage's report where the kubelet reads the termination message."""
    path = Path(report_path())
    text = StageReport.model_validate({"stage": stage, **fields}).encode()
    try:
        path.write_text(text)
    except OSError as exc:
        print(f"trainer: cannot write the report to {path}: {exc}", file=sys.stderr)


def flag(command: list[str], name: str) -> str | None:
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def expand(command: list[str]) -> list[str]:
    """$(JOB_COMPLETION_INDEX) is expanded by the kubelet; expand it here too when run by hand."""
    index = os.environ.get("JOB_COMPLETION_INDEX", "0")
    return [a.replace("$(JOB_COMPLETION_INDEX)", index) for a in command]
