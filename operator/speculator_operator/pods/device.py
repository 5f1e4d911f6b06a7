"""The device a vLLM server pod runs on, as the sweep records it: the GPU's name where the pod has one (nvidia-smi,
else the driver's /proc entry), else `cpu`. The server's entrypoint writes it, with the K it serves, into the workspace
for the sweep's client (a client pod has no GPU of its own)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

PROC_GPUS = Path("/proc/driver/nvidia/gpus")


def device_name() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
            )
            names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
            if out.returncode == 0 and names:
                return names[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    for info in sorted(PROC_GPUS.glob("*/information")) if PROC_GPUS.is_dir() else []:
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                return value.strip()
    return "cpu"


def write_device_file(path: str, k: int) -> None:
    """`{"device": ..., "k": K}` at `path` (K 0: the server serves without a draft)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({"device": device_name(), "k": k}))
    tmp.replace(target)


def read_device_file(path: str) -> tuple[str, int] | None:
    try:
        value = json.loads(Path(path).read_text())
        return str(value["device"]), int(value["k"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
