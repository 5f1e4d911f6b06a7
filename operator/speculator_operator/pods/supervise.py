"""Run vLLM as the server container's one child, and say why it stopped when it fails.

The entrypoint stays the container's first process: it starts vLLM with the rendered argv, passes every signal
the kubelet sends on to it (SIGTERM first: vLLM's own graceful shutdown), copies vLLM's output through line by
line (`kubectl logs` shows what it always showed) while keeping its last lines, and when vLLM exits with a
failure nobody asked for, leaves a `ServerExit` record as the termination message (docs/design/pod-contract.md):

- `NoAccelerator` when vLLM's own platform detection, asked once more in the same pod and environment, resolves
  no device (a CUDA build on a node without a visible GPU);
- `EngineExited` otherwise, with the platform it resolved;

each with the tail of vLLM's output. The exit status is vLLM's (128 + N for a signal N), so restarts and Job
failure policies see what they always saw.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO, BinaryIO

from speculator_operator.api.podcontract import SERVER_EXIT_TAIL, ServerExit, ServerExitReason, report_path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
TAIL_LINES = 40
PROBE_TIMEOUT_SECONDS = 120.0
# vLLM resolves its platform once per process (vllm.platforms.current_platform); UnspecifiedPlatform's device type
# is the empty string
PLATFORM_PROBE = "from vllm.platforms import current_platform as p; print('speculator-platform=' + p.device_type)"
PLATFORM_PREFIX = "speculator-platform="


class Tail:
    """The last lines two threads copied, in the order they were written out (one lock for the write and the keeping,
    so that where both streams go to one log, the tail reads as the log does)."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._lock = threading.Lock()

    def copy(self, line: bytes, sink: BinaryIO) -> None:
        with self._lock:
            with contextlib.suppress(OSError, ValueError):
                sink.write(line)
                sink.flush()
            self._lines.append(line.decode(errors="replace").rstrip("\r\n"))

    def text(self, limit: int = SERVER_EXIT_TAIL) -> str:
        with self._lock:
            text = "\n".join(self._lines)
        return text[-limit:]


def _pump(source: IO[bytes], sink: BinaryIO, tail: Tail) -> None:
    for line in iter(source.readline, b""):
        tail.copy(line, sink)
    source.close()


def probe_platform(python: str, env: dict[str, str]) -> str | None:
    """The device type vLLM resolves in this environment ("" for none); None when it cannot be asked."""
    try:
        out = subprocess.run(
            [python, "-c", PLATFORM_PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        if line.startswith(PLATFORM_PREFIX):
            return line[len(PLATFORM_PREFIX) :].strip()
    return None


def classify(exit_code: int, platform: str | None, tail: str) -> ServerExit:
    """The record of a failed vLLM: the reason from the platform vLLM resolves, the words, then the tail."""
    said = f"; its last output:\n{tail}" if tail else ""
    if platform == "":
        return ServerExit(
            reason=ServerExitReason.NO_ACCELERATOR,
            exitCode=exit_code,
            platform=platform,
            message=(
                f"vLLM resolves no accelerator it can run on in this pod and exited with status {exit_code}: serve "
                "on a node with a visible GPU (a resources limit on nvidia.com/gpu, the NVIDIA driver and device "
                f"plugin) or with the cpu server image{said}"
            ),
        )
    where = f"on its {platform} platform" if platform else "(its platform could not be asked)"
    return ServerExit(
        reason=ServerExitReason.ENGINE_EXITED,
        exitCode=exit_code,
        platform=platform,
        message=f"vLLM exited with status {exit_code} {where}{said}",
    )


def write_record(record: ServerExit, path: str | None = None) -> None:
    """Leave the record where the kubelet reads the termination message (best effort: a read-only path is no
    reason to hide vLLM's own exit status)."""
    with contextlib.suppress(OSError):
        Path(path or report_path()).write_text(record.encode())


def supervise(
    argv: list[str],
    python: str | None = None,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    record_path: str | None = None,
) -> int:
    """Run `argv` (vLLM) to its end; returns its exit status. On a failure no signal asked for, write the
    `ServerExit` record (`python`: the interpreter to ask vLLM's platform with)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its log lines reach the pod's log as they are written
    tail = Tail()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    asked: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    assert proc.stdout is not None
    assert proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, stdout or sys.stdout.buffer, tail), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, stderr or sys.stderr.buffer, tail), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    try:
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for pump in pumps:
        pump.join(timeout=10)
    code = status if status >= 0 else 128 - status
    if status == 0 or asked:
        return code
    record = classify(code, probe_platform(python or sys.executable, env), tail.text())
    write_record(record, record_path)
    print(f"serve: {record.reason}: vLLM exited with status {code}", file=sys.stderr, flush=True)
    return code
