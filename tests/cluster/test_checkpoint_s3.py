"""Header-only audit of checkpoints stored in the real S3 server (versitygw), by ranged GETs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from speculator_operator.adapters.checkpoints import audit, load_checkpoint, read_verifier
from speculator_operator.adapters.sources import S3Source
from speculator_operator.domain.checkpoint import CheckpointError

from ..ckptgen import SMALL_QWEN3 as SMALL
from ..ckptgen import dflash, eagle3, write_checkpoint
from .conftest import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def s3_env(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> str:
    if cluster.s3 is None:
        pytest.skip("the cluster under test came from KUBECONFIG and AWS_ENDPOINT_URL is not set")
    for key, value in cluster.s3.env().items():
        monkeypatch.setenv(key, value)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return bucket


def upload(folder: Path, bucket: str, prefix: str) -> None:
    s3 = boto3.client("s3")
    for path in sorted(folder.iterdir()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def test_s3_checkpoint_is_audited_with_two_ranged_reads_per_file(tmp_path: Path, s3_env: str) -> None:
    write_checkpoint(tmp_path / "ck", *eagle3(SMALL, draft_vocab=1024), sparse=False)
    upload(tmp_path / "ck", s3_env, "drafts/eagle3")
    ck = load_checkpoint(f"s3://{s3_env}/drafts/eagle3")
    assert isinstance(ck.source, S3Source)
    stats = ck.source.stats
    assert stats.per_file_requests["model.safetensors"] == 2
    header = 8 + int.from_bytes((tmp_path / "ck" / "model.safetensors").read_bytes()[:8], "little")
    assert stats.bytes_read == header + (tmp_path / "ck" / "config.json").stat().st_size
    assert ck.revision is not None
    assert ck.revision.startswith("s3:")
    assert stats.requests == 1 + 1 + 2  # one listing, config.json, two ranged reads of the weights
    report = audit(ck, verifier=SMALL)
    assert report.ok, [f.message for f in report.errors]


def test_sharded_s3_checkpoint(tmp_path: Path, s3_env: str) -> None:
    write_checkpoint(tmp_path / "ck", *dflash(SMALL, layers=3), shards=3, sparse=False)
    upload(tmp_path / "ck", s3_env, "drafts/dflash")
    ck = load_checkpoint(f"s3://{s3_env}/drafts/dflash")
    assert len(ck.files) == 3
    assert all(ck.source.stats.per_file_requests[f] == 2 for f in ck.files)
    assert audit(ck, verifier=SMALL).ok


def test_deep_mode_samples_data_by_ranged_reads(tmp_path: Path, s3_env: str) -> None:
    # a checkpoint whose weights were never written: every byte is zero
    write_checkpoint(tmp_path / "ck", *eagle3(SMALL, draft_vocab=1024), sparse=True)
    upload(tmp_path / "ck", s3_env, "drafts/zeros")
    report = audit(f"s3://{s3_env}/drafts/zeros", verifier=SMALL, deep=True)
    messages = [f.message for f in report.errors if f.rule == "deep-loaded"]
    assert any("lm_head.weight: the sampled rows are all zero" in m for m in messages)
    size = sum(report.checkpoint.file_sizes.values())
    assert report.checkpoint.bytes_read < size  # sampled, not downloaded


def test_missing_s3_objects_are_clear_errors(s3_env: str) -> None:
    with pytest.raises(CheckpointError, match=r"config\.json: no such object"):
        load_checkpoint(f"s3://{s3_env}/nothing/here")
    with pytest.raises(CheckpointError, match="NoSuchBucket"):
        load_checkpoint("s3://no-such-bucket-here/x")


def test_cli_audits_s3_with_the_standard_aws_variables(tmp_path: Path, s3_env: str) -> None:
    write_checkpoint(tmp_path / "ck", *dflash(SMALL, layers=2), sparse=False)
    upload(tmp_path / "ck", s3_env, "cli")
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "config.json").write_text(json.dumps(SMALL))
    upload(tmp_path / "v", s3_env, "verifier")
    out = subprocess.run(
        [sys.executable, "-m", "speculator_operator.cli", "audit", f"s3://{s3_env}/cli",
         "--verifier", f"s3://{s3_env}/verifier", "--format", "json"],
        capture_output=True, text=True, env=dict(os.environ), timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"]
    assert report["checkpoint"]["verifier_revision"].startswith("s3:")


def test_stage_copies_exactly_the_audited_files_and_refuses_any_other(tmp_path: Path, s3_env: str) -> None:
    write_checkpoint(tmp_path / "ck", *eagle3(SMALL, draft_vocab=1024), sparse=False)
    upload(tmp_path / "ck", s3_env, "stage/ck")
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_env, Key="stage/ck/README.md", Body=b"# not read by vLLM")
    ck = load_checkpoint(f"s3://{s3_env}/stage/ck")
    assert ck.revision is not None
    assert ck.manifest is not None
    files = ck.manifest.to_arg()

    def stage(dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["stage", f"s3://{s3_env}/stage/ck", str(dest), "--revision", ck.revision or "", *extra]
        cli = [sys.executable, "-m", "speculator_operator.cli", *argv]
        return subprocess.run(cli, capture_output=True, text=True, timeout=60)

    ok = stage(tmp_path / "a", "--manifest", files)
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".staged", "config.json", "model.safetensors"]
    assert audit(str(tmp_path / "a"), verifier=SMALL).ok
    again = stage(tmp_path / "a", "--manifest", files)
    assert "already in" in again.stderr  # idempotent: nothing downloaded twice
    # the revision still holds without the list too (a train job's fetch), and a file vLLM does not read
    # moves nothing
    s3.put_object(Bucket=s3_env, Key="stage/ck/README.md", Body=b"# edited")
    assert stage(tmp_path / "b").returncode == 0
    # new weights under the same config.json: the revision moves, and staging the audited one refuses
    write_checkpoint(tmp_path / "new", *eagle3(SMALL, draft_vocab=1024), sparse=False, fill=b"\x07")
    s3.upload_file(str(tmp_path / "new" / "model.safetensors"), s3_env, "stage/ck/model.safetensors")
    assert load_checkpoint(f"s3://{s3_env}/stage/ck").revision != ck.revision
    listed = stage(tmp_path / "c", "--manifest", files)
    assert listed.returncode == 1
    assert f"s3://{s3_env}/stage/ck/model.safetensors is not the audited file: replaced after the audit" in (
        listed.stderr
    )
    assert not (tmp_path / "c" / "model.safetensors").exists()
    unlisted = stage(tmp_path / "d")
    assert unlisted.returncode == 1
    assert f"is no longer revision {ck.revision}" in unlisted.stderr


def test_the_revision_of_an_s3_checkpoint_names_its_bytes_not_its_config(tmp_path: Path, s3_env: str) -> None:
    """The demo's two drafts: identical config.json, different weights."""
    config, tensors = eagle3(SMALL, draft_vocab=1024)
    write_checkpoint(tmp_path / "good", config, tensors, sparse=False)
    broken = {**tensors, "fc.weight": ("BF16", [256, 512])}
    write_checkpoint(tmp_path / "broken", config, broken, sparse=False)
    upload(tmp_path / "good", s3_env, "good")
    upload(tmp_path / "broken", s3_env, "broken")
    good, bad = load_checkpoint(f"s3://{s3_env}/good"), load_checkpoint(f"s3://{s3_env}/broken")
    assert good.config == bad.config
    assert good.revision != bad.revision
    # the same bytes elsewhere are the same revision: it names content, not a place
    upload(tmp_path / "good", s3_env, "copy/of/good")
    assert load_checkpoint(f"s3://{s3_env}/copy/of/good").revision == good.revision
    # a verifier too: new weights or a new tokenizer under the same config.json move its revision
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_env, Key="verifier/config.json", Body=json.dumps(SMALL).encode())
    s3.put_object(Bucket=s3_env, Key="verifier/model.safetensors", Body=b"weights")
    s3.put_object(Bucket=s3_env, Key="verifier/README.md", Body=b"# a model")
    before = read_verifier(f"s3://{s3_env}/verifier")
    assert before.manifest is not None
    assert before.manifest.names == ["config.json", "model.safetensors"]
    s3.put_object(Bucket=s3_env, Key="verifier/README.md", Body=b"# a model, edited")
    assert read_verifier(f"s3://{s3_env}/verifier").revision == before.revision  # not read by vLLM
    s3.put_object(Bucket=s3_env, Key="verifier/model.safetensors", Body=b"WEIGHTS")
    after = read_verifier(f"s3://{s3_env}/verifier")
    assert after.config == before.config
    assert after.revision != before.revision
    s3.put_object(Bucket=s3_env, Key="verifier/tokenizer.json", Body=b"{}")
    assert read_verifier(f"s3://{s3_env}/verifier").revision not in (before.revision, after.revision)


def test_a_read_pinned_to_the_listing_refuses_an_object_replaced_meanwhile(tmp_path: Path, s3_env: str) -> None:
    write_checkpoint(tmp_path / "ck", *eagle3(SMALL, draft_vocab=1024), sparse=False)
    upload(tmp_path / "ck", s3_env, "race")
    source = S3Source(s3_env, "race")
    source.listing()  # the revision is decided here ...
    boto3.client("s3").put_object(Bucket=s3_env, Key="race/config.json", Body=b"{}")  # ... then replaced
    with pytest.raises(CheckpointError, match=r"config\.json: replaced while it was being read"):
        load_checkpoint(source)
