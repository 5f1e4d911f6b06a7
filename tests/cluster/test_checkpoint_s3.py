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

from speculator_operator.checkpoint import CheckpointError, audit, load_checkpoint
from speculator_operator.checkpoint.sources import S3Source

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
    assert ck.revision.startswith("etag:")
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
    assert report["checkpoint"]["verifier_revision"].startswith("etag:")


def test_stage_copies_a_checkpoint_and_refuses_one_that_changed(tmp_path: Path, s3_env: str) -> None:
    write_checkpoint(tmp_path / "ck", *eagle3(SMALL, draft_vocab=1024), sparse=False)
    upload(tmp_path / "ck", s3_env, "stage/ck")
    revision = load_checkpoint(f"s3://{s3_env}/stage/ck").revision
    assert revision is not None

    def stage(dest: Path, rev: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "speculator_operator.cli", "stage", f"s3://{s3_env}/stage/ck",
                               str(dest), "--revision", rev], capture_output=True, text=True, timeout=60)  # fmt: skip

    ok = stage(tmp_path / "a", revision)
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".staged", "config.json", "model.safetensors"]
    assert audit(str(tmp_path / "a"), verifier=SMALL).ok
    again = stage(tmp_path / "a", revision)
    assert "already in" in again.stderr  # idempotent: nothing downloaded twice
    # the object is replaced after the pair was audited: staging the audited revision must fail
    boto3.client("s3").put_object(Bucket=s3_env, Key="stage/ck/config.json", Body=b'{"changed": true}')
    changed = stage(tmp_path / "b", revision)
    assert changed.returncode == 1
    assert "changed since it was audited" in changed.stderr
