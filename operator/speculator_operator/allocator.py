"""The C allocator set for a long-running process with many threads. glibc gives each thread that allocates
an arena of its own, up to eight per core; memory freed in one stays with it. The operator's handler threads
(kopf's pool, the child lane, the periodic lane) each touch one, and what a burst freed there stayed resident.
Two arenas, set before the first thread starts, are what the usual MALLOC_ARENA_MAX=2 gives a Python server;
a MALLOC_ARENA_MAX in the environment wins, since glibc read it at start."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time

M_ARENA_MAX = -8  # from glibc's malloc.h
ARENAS = 2
TRIM_SECONDS = float(os.environ.get("SPECULATOR_TRIM_SECONDS", "10"))


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's arenas (True when set; False on another C library or when MALLOC_ARENA_MAX is given)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim); False where there is none."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)  # 1 when it released memory, 0 when there was none to release
    return True


def keep_trimmed(interval: float = TRIM_SECONDS) -> threading.Thread:
    """A daemon thread that trims the C heap every `interval` seconds: glibc returns freed memory to the
    system only from the top of a heap, so what a burst of reconciles freed in the middle stayed resident
    (measured at 1,000 resources: 13 MiB of the heap freed but kept)."""

    def loop() -> None:
        while True:
            time.sleep(interval)
            trim()

    thread = threading.Thread(target=loop, name="malloc-trim", daemon=True)
    thread.start()
    return thread
