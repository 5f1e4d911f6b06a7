"""The C allocator set for a long-running process with many threads. glibc gives each thread that allocates
an arena of its own, up to eight per core; memory freed in one stays with it. The operator's handler threads
(kopf's pool, the child lane, the periodic lane) each touch one, and what a burst freed there stayed resident.
Two arenas, set before the first thread starts, are what the usual MALLOC_ARENA_MAX=2 gives a Python server;
a MALLOC_ARENA_MAX in the environment wins, since glibc read it at start."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # from glibc's malloc.h
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's arenas (True when set; False on another C library or when MALLOC_ARENA_MAX is given)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))
