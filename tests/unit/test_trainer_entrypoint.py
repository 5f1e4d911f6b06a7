"""The trainer image's entrypoint: reports, checkpoint resolution, digests and the folder publish."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit, checkpoint_dir, load_checkpoint
from speculator_operator.api import podcontract
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.checkpoint.manifest import LATEST, PROVENANCE
from speculator_operator.domain.checkpoint.safetensors_header import header_length, parse_header
from speculator_operator.pods import trainer
from speculator_operator.pods.trainer.run import NOT_STITCHED, _stitched_from

from ..ckptgen import SMALL_QWEN3, eagle3, write_checkpoint, write_safetensors


@pytest.fixture
def report_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(podcontract.REPORT_PATH_ENV, str(path))
    return path


def saved_run(root: Path) -> Path:
    """A save path as `speculators train` leaves it: epoch folders and a relative checkpoint_best link."""
    for epoch in ("0", "1"):
        write_checkpoint(root / epoch, *eagle3(SMALL_QWEN3, draft_vocab=1024, k=3 + int(epoch)))
        (root / epoch / "optimizer_state_dict.pt").write_bytes(b"\0" * 64)
        (root / epoch / "training_state.json").write_text(json.dumps({"epoch": int(epoch)}))
    (root / "checkpoint_best").symlink_to("0")
    config = json.loads((root / "0" / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = "/workspace/verifier"
    (root / "0" / "config.json").write_text(json.dumps(config))
    return root


def test_run_reports_on_success_and_keeps_quiet_on_failure(tmp_path: Path, report_file: Path) -> None:
    out = tmp_path / "hs"
    out.mkdir()
    for i in range(3):
        (out / f"hs_{i}.safetensors").write_bytes(b"x")
    code = trainer.run("extract", [sys.executable, "-c", "pass", "--output", str(out)])
    assert code == 0
    body = json.loads(report_file.read_text())
    assert body["speculatorsReport"] == 1
    assert body["stage"] == "extract"
    assert body["samples"] == 3
    report_file.unlink()
    assert trainer.run("train", [sys.executable, "-c", "import sys; sys.exit(7)"]) == 7
    assert not report_file.exists()  # the kubelet then keeps the log tail (FallbackToLogsOnError)
    assert trainer.run("train", ["/nonexistent/tool"]) == 2


def test_reports_fit_the_termination_message(report_file: Path) -> None:
    findings = [{"rule": "r", "severity": "warning", "message": "m" * 300} for _ in range(40)]
    trainer.report("audit", audit={"ok": True, "findings": findings})
    text = report_file.read_text()
    assert len(text.encode()) <= podcontract.REPORT_LIMIT
    assert 0 < len(json.loads(text)["audit"]["findings"]) < 40


def test_the_checkpoint_is_checkpoint_best_else_the_last_epoch_else_the_folder(tmp_path: Path) -> None:
    root = saved_run(tmp_path / "run")
    assert checkpoint_dir(root) == (root / "0").resolve()
    (root / "checkpoint_best").unlink()
    assert checkpoint_dir(root) == root / "1"
    dry = tmp_path / "dry"
    write_checkpoint(dry, *eagle3(SMALL_QWEN3, draft_vocab=1024))
    assert checkpoint_dir(dry) == dry
    with pytest.raises(CheckpointError):
        checkpoint_dir(tmp_path / "empty")


def test_publish_to_a_folder_never_overwrites_and_points_latest_at_the_new_location(
    tmp_path: Path, report_file: Path
) -> None:
    root = saved_run(tmp_path / "run")
    target = tmp_path / "out" / "draft"
    args = ("Qwen/Qwen3-8B", "sha-1", "ml/q", "2026.11-vllm0.32")
    assert trainer.publish(str(root), str(target), *args, uri="pvc://drafts/draft") == 0
    first = json.loads(report_file.read_text())
    folder = trainer.location_name(first["digest"])
    assert first["uri"] == f"pvc://drafts/draft/{folder}"  # the exact location, as the user names the claim
    assert sorted(p.name for p in target.iterdir()) == [folder, LATEST]
    published = target / folder
    names = sorted(p.name for p in published.iterdir())
    assert "optimizer_state_dict.pt" not in names
    assert PROVENANCE in names
    config = json.loads((published / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "Qwen/Qwen3-8B"  # not the pod path
    marker = json.loads((published / PROVENANCE).read_text())
    assert marker["digest"] == first["digest"]
    assert marker["verifierRevision"] == "sha-1"
    assert marker["location"] == first["uri"]
    # every file with its sha256 and size, as the stage container checks them
    for name in ("config.json", "model.safetensors"):
        assert marker["files"][name]["size"] == (published / name).stat().st_size
        assert marker["files"][name]["sha256"] == hashlib.sha256((published / name).read_bytes()).hexdigest()
    # the folder reads through the pointer, and the published checkpoint passes its own provenance rule
    ck = load_checkpoint(str(target))
    assert ck.uri == str(published)
    assert ck.resolved_from == str(target)
    assert ck.provenance is not None
    assert ck.provenance["digest"] == first["digest"]
    report = audit(ck, verifier=SMALL_QWEN3, verifier_revision="sha-1")
    assert not [f for f in report.findings if f.rule in ("provenance", "verifier-revision")]
    stamp = (published / "model.safetensors").stat().st_mtime_ns

    # again: the same digest, the same folder, untouched
    assert trainer.publish(str(root), str(target), *args, uri="pvc://drafts/draft") == 0
    assert json.loads(report_file.read_text())["digest"] == first["digest"]
    assert (published / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in target.iterdir()) == [folder, LATEST]

    # another checkpoint: a new folder beside the first, which stays whole; the pointer moves
    (root / "checkpoint_best").unlink()
    assert trainer.publish(str(root), str(target), *args, uri="pvc://drafts/draft") == 0
    second = json.loads(report_file.read_text())
    assert second["digest"] != first["digest"]
    assert sorted(p.name for p in target.iterdir()) == sorted([folder, trainer.location_name(second["digest"]), LATEST])
    assert (published / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((target / LATEST).read_text())["name"] == trainer.location_name(second["digest"])
    assert load_checkpoint(str(target)).uri == str(target / trainer.location_name(second["digest"]))


def test_publish_refuses_a_missing_checkpoint(tmp_path: Path, report_file: Path) -> None:
    assert trainer.publish(str(tmp_path / "none"), str(tmp_path / "t"), "v", "r", "ns/j", "2026.11-vllm0.32") == 2
    assert not (tmp_path / "t").exists()


def test_audit_exit_codes(tmp_path: Path, report_file: Path) -> None:
    from ..ckptgen import QWEN3_8B

    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "config.json").write_text(json.dumps(QWEN3_8B))
    good = tmp_path / "good"
    write_checkpoint(good, *eagle3())
    assert trainer.audit_checkpoint(str(good), str(tmp_path / "verifier"), "2026.11-vllm0.32") == 0
    assert json.loads(report_file.read_text())["audit"]["ok"] is True
    config, tensors = eagle3()
    tensors["fc.weight"] = ("BF16", [4096, 4096])
    write_checkpoint(tmp_path / "bad", config, tensors)
    assert trainer.audit_checkpoint(str(tmp_path / "bad"), str(tmp_path / "verifier"), "2026.11-vllm0.32") == 1
    assert trainer.audit_checkpoint(str(tmp_path / "nothing"), str(tmp_path / "verifier"), None) == 2


def test_the_same_bytes_for_another_verifier_revision_get_their_own_folder(tmp_path: Path, report_file: Path) -> None:
    root = saved_run(tmp_path / "run")
    target = tmp_path / "out"
    assert trainer.publish(str(root), str(target), "Qwen/Qwen3-8B", "rev-a", "ml/a", "2026.11-vllm0.32") == 0
    first = json.loads(report_file.read_text())
    assert trainer.publish(str(root), str(target), "Qwen/Qwen3-8B", "rev-b", "ml/b", "2026.11-vllm0.32") == 0
    second = json.loads(report_file.read_text())
    assert second["digest"] == first["digest"]  # the same files ...
    assert second["uri"] != first["uri"]  # ... but each record says what its copy was trained for
    records = [json.loads((Path(r["uri"]) / PROVENANCE).read_text()) for r in (first, second)]
    assert [r["verifierRevision"] for r in records] == ["rev-a", "rev-b"]


def test_stitching_leaves_out_the_verifiers_frozen_copies_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "config.json").write_text('{"speculators_model_type": "mtp"}')
    tensors = {"mtp_layers.0.input_proj.weight": ("BF16", [4, 8]), "verifier_lm_head.weight": ("BF16", [16, 4]),
               "mtp_layers.0.final_layernorm.weight": ("F32", [4])}  # fmt: skip
    write_safetensors(root / "model.safetensors", tensors, sparse=False, fill=bytes(range(1, 200)))
    command = _stitched_from(["speculators", "stitch-mtp", str(root), "/v", "--output-path", "/out"])
    clean = Path(command[2])
    assert clean == tmp_path / "checkpoints-stitch-input"
    assert (clean / "config.json").read_text() == '{"speculators_model_type": "mtp"}'

    def read(path: Path) -> dict[str, bytes]:
        data = path.read_bytes()
        n = header_length(data[:8], str(path), len(data))
        found, _ = parse_header(data[8 : 8 + n], str(path), len(data))
        return {k: data[t.start : t.start + t.nbytes] for k, t in found.items()}

    before = read(root / "model.safetensors")
    after = read(clean / "model.safetensors")
    assert set(after) == {k for k in before if not NOT_STITCHED.match(k)}
    assert all(after[k] == before[k] for k in after)  # the kept tensors' bytes, unchanged
    # nothing to leave out: stitch-mtp reads the checkpoint where it is
    (root / "model.safetensors").unlink()
    write_safetensors(root / "model.safetensors", {"mtp_layers.0.x": ("BF16", [2])}, sparse=False)
    assert _stitched_from(["speculators", "stitch-mtp", str(root), "/v"])[2] == str(root)


def test_a_converted_full_attention_dflash_is_marked_non_causal_as_it_was_trained(tmp_path: Path) -> None:
    def converted(layer_types: list[str], algorithm: str = "dflash") -> dict[str, Any]:
        config = {"speculators_model_type": algorithm, "sliding_window_non_causal": False,
                  "transformer_layer_config": {"layer_types": layer_types}}  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(config))
        notes = trainer.causal_as_trained(tmp_path)
        return {"notes": notes, **json.loads((tmp_path / "config.json").read_text())}

    full = converted(["full_attention"] * 2)
    assert full["sliding_window_non_causal"] is True
    assert "all 2 layers have full attention" in full["notes"][0]
    windows = converted(["sliding_attention", "full_attention"])  # causal windows as speculators trains them
    assert windows["sliding_window_non_causal"] is False
    assert windows["notes"] == []
    assert converted(["full_attention"], "eagle3")["notes"] == []


def test_run_relays_the_tools_output_and_ends_with_its_progress_line(
    report_file: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tool = (
        "import sys; print('Training epoch 1/2 started'); "
        "print('train/loss=1.500, train/full_acc_0=0.250, epoch=0, lr=3.00e-04, global_step=3'); "
        "print('a warning', file=sys.stderr)"
    )
    assert trainer.run("train", [sys.executable, "-c", tool]) == 0
    out, err = capfd.readouterr()
    assert "global_step=3" in out  # relayed to the pod's log as the tool printed it
    assert "a warning" in err
    last = [line for line in err.splitlines() if line.startswith("speculators-progress ")][-1]
    assert podcontract.parse_progress(last, "train") == {
        "step": 3, "epoch": 1, "epochs": 2, "loss": 1.5, "metrics": {"train/loss": 1.5, "train/full_acc_0": 0.25}
    }  # fmt: skip


def test_a_conversion_that_left_weights_unfilled_fails(report_file: Path) -> None:
    tool = "import sys; print('WARNING | Missing keys in checkpoint: [\\'layers.0.q_proj.weight\\']', file=sys.stderr)"
    assert trainer.run("convert", [sys.executable, "-c", tool, "--output-path", "/nonexistent"]) == 1
    assert not report_file.exists()
