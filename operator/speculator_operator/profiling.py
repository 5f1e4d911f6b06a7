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


def report() -> str:
    """The live allocations by package, largest first, with the resident set beside them."""
    snapshot = tracemalloc.take_snapshot()
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for stat in snapshot.statistics("filename"):
        key = _package(stat.traceback[0].filename)
        sizes[key] += stat.size
        counts[key] += stat.count
    traced, peak = tracemalloc.get_traced_memory()
    rss = _resident()
    lines = [
        f"resident set: {rss / 2**20:.1f} MiB; traced by Python: {traced / 2**20:.1f} MiB (peak {peak / 2**20:.1f}); "
        f"threads: {threading.active_count()}",
        f"{'MiB':>8} {'blocks':>9}  package",
    ]
    for key, size in sizes.most_common(25):
        lines.append(f"{size / 2**20:8.2f} {counts[key]:9d}  {key}")
    return "\n".join(lines) + "\n"


def install() -> None:
    """Start tracing when SPECULATOR_PROFILE names a file; SIGUSR1 then writes the report there."""
    path = os.environ.get("SPECULATOR_PROFILE")
    if not path:
        return
    tracemalloc.start(1)

    def write(signum: int, frame: FrameType | None) -> None:
        Path(path + ".part").write_text(report())
        os.replace(path + ".part", path)  # whole or not there: a reader polls for the name

    signal.signal(signal.SIGUSR1, write)
