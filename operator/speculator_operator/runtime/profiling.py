"""Where the operator's memory goes, measured rather than guessed: with SPECULATOR_PROFILE=PATH the process
traces Python's allocations (tracemalloc) from the start, and each SIGUSR1 writes to PATH the live
allocations grouped by package (a module of this project counts as its own), beside the resident set and
what Python's allocator does not see (threads' stacks, C libraries, the allocator's own free lists).

It costs time and memory while it traces: a profile run is its own run, not the one whose figures count.
SPECULATOR_PROFILE_MODE=census traces nothing: SIGUSR1 then writes the C allocator's figures (in use, and
freed but kept by the process) and the live Python objects by type, cheap enough for the run that counts.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from speculator_operator.runtime.allocator import mallinfo


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


def allocator() -> str:
    """glibc's own account of the heap (mallinfo2): what is in use, and what was freed but stays with the
    process (the resident set keeps a peak's memory until the allocator gives it back)."""
    info = mallinfo()
    if info is None:
        return "C allocator: no mallinfo2 here"
    mib = 2**20
    return (
        f"C allocator: in use {(info.uordblks + info.hblkhd) / mib:.1f} MiB (of it mmapped {info.hblkhd / mib:.1f}), "
        f"freed but kept {info.fordblks / mib:.1f} MiB, heap arenas {info.arena / mib:.1f} MiB"
    )


def python_allocator() -> str:
    """Python's small-object allocator (its arenas come from mmap, outside glibc's figures): arenas held now
    and at their high-water mark, and how much of them live objects use. Read from sys._debugmallocstats,
    which writes to the C stderr: redirected for the moment it takes."""
    import tempfile

    with tempfile.TemporaryFile(mode="w+b") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.startswith("# "):
            found[key[2:].strip()] = int(value.strip().replace(",", "") or 0)
    live = found.get("bytes in allocated blocks", 0) / 2**20
    return (
        f"Python's allocator: {found.get('arenas allocated current', 0)} arenas of 1 MiB (high-water mark "
        f"{found.get('arenas highwater mark', 0)}), in live blocks {live:.1f} MiB"
    )


def census(top: int = 15) -> list[str]:
    """The live objects the garbage collector tracks, by type: how many, and their own sizes (not what they
    refer to: a dict's keys and values are counted as objects of their own types when tracked)."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = type(obj).__qualname__
        counts[kind] += 1
        sizes[kind] += sys.getsizeof(obj, 0)
    lines = [f"{'MiB':>8} {'objects':>9}  type (objects tracked by the collector: {sum(counts.values())})"]
    for kind, size in sizes.most_common(top):
        lines.append(f"{size / 2**20:8.2f} {counts[kind]:9d}  {kind}")
    return lines


def _shape(obj: object) -> str:
    keys = sorted(str(k) for k in obj)[:6]  # type: ignore[attr-defined]
    return "{" + ",".join(keys) + (",…" if len(obj) > 6 else "") + "}"  # type: ignore[arg-type]


def _label(obj: object) -> str:
    if type(obj) is dict:
        return _shape(obj)
    if type(obj) is type(sys):
        return f"module {obj.__name__}"
    return type(obj).__qualname__


def shapes(top: int = 25) -> list[str]:
    """The dicts alive, by their keys, with one chain of what holds them: which kind of state is kept many times
    over (a pod's condition, a body's metadata) and by whom. The collector does not track a dict of plain
    values, so the dicts are found as what the tracked objects refer to."""
    parent_of: dict[int, object] = {}
    dicts: dict[int, dict[Any, Any]] = {}
    for parent in gc.get_objects():
        for child in gc.get_referents(parent):
            if id(child) not in parent_of and type(child) in (dict, list, tuple, set):
                parent_of[id(child)] = parent
                if type(child) is dict:
                    dicts[id(child)] = child
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    example: dict[str, dict[Any, Any]] = {}
    for found in dicts.values():
        shape = _shape(found)
        counts[shape] += 1
        sizes[shape] += sys.getsizeof(found)
        example.setdefault(shape, found)
    lines = [f"{'MiB':>8} {'dicts':>9}  keys, then one chain of holders — {len(dicts)} dicts"]
    for shape, count in counts.most_common(top):
        chain: list[str] = []
        at: object = example[shape]
        for _ in range(7):
            holder = parent_of.get(id(at))
            if holder is None:
                break
            chain.append(_label(holder)[:60])
            at = holder
        lines.append(f"{sizes[shape] / 2**20:8.2f} {count:9d}  {shape[:80]} <- {' <- '.join(chain)}")
    return lines


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
    """The live allocations by package, largest first, now and at the sampled peak, with the resident set
    (while not tracing: the allocator's figures and the live objects by type)."""
    if not tracemalloc.is_tracing():
        return "\n".join([
            f"resident set: {_resident() / 2**20:.1f} MiB; threads: {threading.active_count()}",
            allocator(),
            python_allocator(),
            *census(),
            *shapes(),
        ]) + "\n"  # fmt: skip
    traced, peak = tracemalloc.get_traced_memory()
    lines = [
        f"resident set: {_resident() / 2**20:.1f} MiB; traced by Python: {traced / 2**20:.1f} MiB (peak "
        f"{peak / 2**20:.1f}); threads: {threading.active_count()}",
        allocator(),
        python_allocator(),
        "now:",
        *_grouped(tracemalloc.take_snapshot()),
    ]
    if _peak.snapshot is not None:
        lines += [f"at the sampled peak ({_peak.traced / 2**20:.1f} MiB traced):", *_grouped(_peak.snapshot)]
    return "\n".join(lines) + "\n"


def install(path: str | None, mode: str = "trace") -> None:
    """Start tracing when `path` (SPECULATOR_PROFILE) names a file; SIGUSR1 then writes the report there. `mode`
    (SPECULATOR_PROFILE_MODE) "census" counts live objects only, without tracemalloc's cost."""
    if not path:
        return
    if mode != "census":
        tracemalloc.start(6)
        _peak.start()

    def write(signum: int, frame: FrameType | None) -> None:
        Path(path + ".part").write_text(report())
        os.replace(path + ".part", path)  # whole or not there: a reader polls for the name

    signal.signal(signal.SIGUSR1, write)
