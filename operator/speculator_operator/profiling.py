"""Where the operator's memory goes, measured rather than guessed: with SPECULATOR_PROFILE=PATH the process
traces Python's allocations (tracemalloc) from the start, and each SIGUSR1 writes to PATH the live
allocations grouped by package (a module of this project counts as its own), beside the resident set and
what Python's allocator does not see (threads' stacks, C libraries, the allocator's own free lists).

It costs time and memory while it traces: a profile run is its own run, not the one whose figures count.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType


def _package(filename: str) -> str:
    parts = Path(filename).parts
    if "speculator_operator" in parts:
        i = parts.index("speculator_operator")
        return "/".join(parts[i : i + 3]).removesuffix(".py")
    if "site-packages" in parts:
        i = parts.index("site-packages")
        return parts[i + 1].removesuffix(".py") if i + 1 < len(parts) else filename
    if "lib" in parts:  # the standard library: by module
        return "stdlib:" + Path(filename).stem
    return filename


def _resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _owner(traceback: tracemalloc.Traceback) -> str:
    """The package responsible for an allocation: the innermost frame outside the standard library and the
    import machinery (json's decoder allocates, but for whoever asked it to decode), with the allocating
    module beside it when that differs."""
    frames = [_package(f.filename) for f in reversed(traceback)]  # innermost first
    innermost = frames[0] if frames else "?"
    for name in frames:
        if not name.startswith(("stdlib:", "<")):
            return name if name == innermost else f"{name} (in {innermost})"
    return innermost


def _grouped(snapshot: tracemalloc.Snapshot) -> list[str]:
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        key = _owner(stat.traceback)
        sizes[key] += stat.size
        counts[key] += stat.count
    lines = [f"{'MiB':>8} {'blocks':>9}  package"]
    for key, size in sizes.most_common(20):
        lines.append(f"{size / 2**20:8.2f} {counts[key]:9d}  {key}")
    return lines


class _Peak(threading.Thread):
    """Keeps the snapshot taken when Python's traced memory was at its highest (sampled every 2 s, a new one
    when a quarter higher): the resident set follows the peak, since freed memory mostly stays with the
    process."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="profile-peak")
        self.snapshot: tracemalloc.Snapshot | None = None
        self.traced = 0

    def run(self) -> None:
        while True:
            time.sleep(2.0)
            traced, _ = tracemalloc.get_traced_memory()
            if traced > self.traced * 1.25:
                self.traced, self.snapshot = traced, tracemalloc.take_snapshot()


_peak = _Peak()


def report() -> str:
    """The live allocations by package, largest first, now and at the sampled peak, with the resident set."""
    traced, peak = tracemalloc.get_traced_memory()
    lines = [
        f"resident set: {_resident() / 2**20:.1f} MiB; traced by Python: {traced / 2**20:.1f} MiB (peak "
        f"{peak / 2**20:.1f}); threads: {threading.active_count()}",
        "now:",
        *_grouped(tracemalloc.take_snapshot()),
    ]
    if _peak.snapshot is not None:
        lines += [f"at the sampled peak ({_peak.traced / 2**20:.1f} MiB traced):", *_grouped(_peak.snapshot)]
    return "\n".join(lines) + "\n"


def install() -> None:
    """Start tracing when SPECULATOR_PROFILE names a file; SIGUSR1 then writes the report there."""
    path = os.environ.get("SPECULATOR_PROFILE")
    if not path:
        return
    tracemalloc.start(6)
    _peak.start()

    def write(signum: int, frame: FrameType | None) -> None:
        Path(path + ".part").write_text(report())
        os.replace(path + ".part", path)  # whole or not there: a reader polls for the name

    signal.signal(signal.SIGUSR1, write)
