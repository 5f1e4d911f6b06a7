"""Linux's x86 xstate permissions, read with arch_prctl (the kernel's Documentation/arch/x86/xstate.rst):
what the CPU and kernel offer, and what a process of a given interpreter holds from its start. Used to check
hack/lib/amx-permission.pth (docs/performance/vllm-cpu-amx.md)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys
from pathlib import Path

ARCH_PRCTL = 158  # the syscall's number on x86_64
ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_GET_XCOMP_PERM = 0x1022
XTILEDATA = 1 << 18  # XFEATURE_XTILEDATA: the AMX tile data

PROBE = f"""
import ctypes, site, sys
if len(sys.argv) > 1:
    site.addsitedir(sys.argv[1])
mask = ctypes.c_ulong(0)
assert ctypes.CDLL(None).syscall({ARCH_PRCTL}, {ARCH_GET_XCOMP_PERM}, ctypes.byref(mask)) == 0
print(mask.value)
"""


def on_x86_64_linux() -> bool:
    return sys.platform == "linux" and platform.machine() == "x86_64"


def offered() -> int:
    """The xstate features this CPU and kernel offer (0 where arch_prctl refuses)."""
    mask = ctypes.c_ulong(0)
    if ctypes.CDLL(None).syscall(ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ctypes.byref(mask)) != 0:
        return 0
    return mask.value


def held_at_start(python: str | Path, *flags: str, site_dir: Path | None = None) -> int:
    """The xstate features a fresh process of `python` holds, after its site processing (and `site_dir`'s)."""
    argv = [str(python), *flags, "-c", PROBE, *([str(site_dir)] if site_dir else [])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.strip())
