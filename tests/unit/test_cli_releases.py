"""`speculator-operator releases`: the table, each release's level and the evidence behind it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speculator_operator.cli import main
from speculator_operator.domain import qualification


def test_the_table_names_each_releases_level_and_the_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)
    assert main(["releases"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "LEVEL", "VLLM", "SPECULATORS", "TORCH", "TRANSFORMERS", "EVIDENCE"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "(default)  Served" in rows["2026.11-vllm0.32"]
    assert "Unqualified" in rows["2026.12-vllm0.34"]
    assert rows["2026.12-vllm0.34"].endswith("none recorded")


def test_one_release_shows_every_check_and_json_carries_the_evidence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)
    installed = {"torch": "2.14.0", "vllm": "0.34.0"}
    record = {"release": "2026.12-vllm0.34", "recorded": "2026-12-07", "machine": "x86_64, 2 cores, 23 GiB",
              "command": "hack/qualify-release 2026.12-vllm0.34", "served": "not served: no CPU build",
              "images": {"server": {"reference": "r/server:t", "digest": "sha256:" + "b" * 64,
                                    "stack": qualification.stack_digest(installed), "installed": installed}},
              "checks": [{"name": "versions", "passed": True, "detail": "vllm 0.34.0"},
                         {"name": "parser", "passed": False, "detail": "refused --x"}]}  # fmt: skip
    (tmp_path / "2026.12-vllm0.34.json").write_text(json.dumps(record))
    assert main(["releases", "2026.12-vllm0.34"]) == 0
    out = capsys.readouterr().out
    assert "Unqualified" in out  # a failed check leaves it unqualified
    assert "1/2 checks passed" in out
    assert "FAIL  parser: refused --x" in out
    assert main(["releases", "2026.12-vllm0.34", "-o", "json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["evidence"]["checks"][1]["passed"] is False
    assert main(["releases", "nope"]) == 2
    assert "unknown release 'nope'" in capsys.readouterr().err
