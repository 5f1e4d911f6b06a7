"""The rules the publish record makes possible: a draft trained for another verifier revision is refused;
a draft with no record is served with a warning; a record that does not match the files is an error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.domain.checkpoint.manifest import PROVENANCE

from ..ckptgen import SMALL_QWEN3, eagle3, write_checkpoint


def published(folder: Path, **record: Any) -> Path:
    """A draft with a publish record as `trainer publish` writes it (every file's sha256 and size)."""
    write_checkpoint(folder, *eagle3(SMALL_QWEN3, draft_vocab=1024), sparse=False)
    files = {
        p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "size": p.stat().st_size}
        for p in folder.iterdir()
    }
    body = {"digest": "sha256:feed", "verifier": "Qwen/Qwen3-8B", "files": files, **record}
    (folder / PROVENANCE).write_text(json.dumps(body))
    return folder


def findings(folder: Path, **kw: Any) -> dict[str, list[tuple[str, str]]]:
    report = audit(str(folder), verifier=SMALL_QWEN3, served_verifier="hf://Qwen/Qwen3-8B", **kw)
    out: dict[str, list[tuple[str, str]]] = {}
    for f in report.findings:
        out.setdefault(f.rule, []).append((str(f.severity), f.message))
    return out


def test_a_draft_trained_for_another_verifier_revision_is_an_error(tmp_path: Path) -> None:
    folder = published(tmp_path / "d", verifierRevision="a" * 40, verifierContent="hf:old")
    found = findings(folder, verifier_revision="b" * 40, verifier_content="hf:new")
    ((severity, message),) = found["verifier-revision"]
    assert severity == "error"
    assert f"Qwen/Qwen3-8B@{'a' * 40}" in message  # what it was trained for
    assert "b" * 40 in message  # what is served
    report = audit(str(folder), verifier=SMALL_QWEN3, verifier_revision="b" * 40, verifier_content="hf:new")
    assert not report.ok


def test_the_same_revision_or_the_same_files_pass(tmp_path: Path) -> None:
    folder = published(tmp_path / "d", verifierRevision="a" * 40, verifierContent="hf:same")
    assert "verifier-revision" not in findings(folder, verifier_revision="a" * 40)
    # a commit that only touched the README moves the sha, not the files vLLM reads
    assert "verifier-revision" not in findings(folder, verifier_revision="c" * 40, verifier_content="hf:same")


def test_without_a_record_the_pairing_is_unproven_but_not_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "d", *eagle3(SMALL_QWEN3, draft_vocab=1024))
    ((severity, message),) = findings(tmp_path / "d", verifier_revision="s3:0123")["verifier-revision"]
    assert severity == "warning"
    assert "unproven" in message
    assert "s3:0123" in message
    # where the served revision is not known either (a trainer's own audit), nothing is said
    assert "verifier-revision" not in findings(tmp_path / "d")


def test_a_record_with_an_unknown_served_revision_is_a_warning(tmp_path: Path) -> None:
    folder = published(tmp_path / "d", verifierRevision="a" * 40)
    ((severity, message),) = findings(folder)["verifier-revision"]
    assert severity == "warning"
    assert "not known here" in message


def test_files_added_replaced_or_removed_after_the_publish_are_errors(tmp_path: Path) -> None:
    folder = published(tmp_path / "d", verifierRevision="r")
    assert "provenance" not in findings(folder, verifier_revision="r")
    (folder / "model-extra.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")
    messages = [m for _, m in findings(folder, verifier_revision="r")["provenance"]]
    assert any("model-extra.safetensors not named by" in m for m in messages)
    assert any("config.json is" in m and "replaced after the publish" in m for m in messages)
    record = json.loads((folder / PROVENANCE).read_text())
    record["files"]["model-00002.safetensors"] = {"sha256": "0" * 64, "size": 8}
    (folder / PROVENANCE).write_text(json.dumps(record))
    messages = [m for _, m in findings(folder, verifier_revision="r")["provenance"]]
    assert any("names model-00002.safetensors, which the checkpoint does not hold" in m for m in messages)


def test_an_unreadable_record_is_an_error_not_a_crash(tmp_path: Path) -> None:
    folder = published(tmp_path / "d", verifierRevision="r")
    (folder / PROVENANCE).write_text("[1, 2")
    ((severity, message),) = findings(folder, verifier_revision="r")["provenance"]
    assert severity == "error"
    assert "not valid JSON" in message
