"""Retention by age in the serving pod (pods/capture/retention.py): a deployment's shards older than
storage.retentionDays go, on a claim and in a bucket; nothing else is touched; a failure is counted and the sweep
goes on next time; the capture being off does not stop what was written from expiring."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from speculator_operator.api import podcontract
from speculator_operator.api.podcontract import CaptureSettings
from speculator_operator.pods.capture.config import LiveSettings
from speculator_operator.pods.capture.retention import Retention, shard_time, sweep
from speculator_operator.pods.capture.spool import PvcWriter, S3Writer, ShardKey, shard_name

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
SETTINGS = {
    "fraction": 1, "maxPerHour": 100, "location": "pvc://captures/live", "namespace": "team", "deployment": "qwen",
    "servedModel": "qwen", "verifierRevision": "v1", "draftRevision": "d1", "k": 3, "retentionDays": 30,
}  # fmt: skip


def count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def key(deployment: str = "qwen", draft: str = "d1") -> ShardKey:
    return ShardKey("pvc://captures/live", "/unused", "team", deployment, "v1", draft)


def shard(root: Path, at: datetime, deployment: str = "qwen", draft: str = "d1") -> str:
    name = shard_name(key(deployment, draft), "live", at, "pod-a", "1-000001")
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(b"{}\n")
    return name


def test_a_shards_time_is_the_head_of_its_name() -> None:
    assert shard_time("live/team/qwen/v1/d1/20261107T120000Z-pod-a-1-000001.jsonl") == datetime(
        2026, 11, 7, 12, tzinfo=UTC
    )
    assert shard_time("live/team/qwen/v1/d1/notes.jsonl") is None
    assert shard_time("live/team/qwen/v1/d1/20261107T120000Z-pod-a.json") is None  # not a shard


def test_the_deployments_old_shards_go_and_nothing_else(tmp_path: Path) -> None:
    old = [shard(tmp_path, NOW - timedelta(days=31)), shard(tmp_path, NOW - timedelta(days=40), draft="d0")]
    kept = [shard(tmp_path, NOW - timedelta(days=29)), shard(tmp_path, NOW)]
    other = shard(tmp_path, NOW - timedelta(days=90), deployment="llama")  # another deployment's: its own pods'
    stray = tmp_path / "live/team/qwen/README"
    stray.write_text("not a shard")
    assert sweep(PvcWriter(tmp_path), "live/team/qwen", NOW, 30) == (2, None)
    assert not any((tmp_path / k).exists() for k in old)
    assert all((tmp_path / k).exists() for k in [*kept, other])
    assert stray.exists()


class Bucket:
    """boto3's S3 client, as far as retention uses it (paged listings, deletes)."""

    def __init__(self, keys: list[str], page: int = 2) -> None:
        self.keys, self.page, self.deleted = keys, page, list[str]()

    def get_paginator(self, name: str) -> Any:
        assert name == "list_objects_v2"
        bucket = self

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> Any:
                found = [k for k in bucket.keys if k.startswith(Prefix)]
                step = bucket.page
                return [{"Contents": [{"Key": k} for k in found[i : i + step]]} for i in range(0, len(found), step)]

        return Pages()

    def delete_object(self, Bucket: str, Key: str) -> None:
        self.deleted.append(Key)


def test_a_bucket_is_swept_across_pages() -> None:
    keys = [shard_name(key(), "live", NOW - timedelta(days=d), "pod-a", f"1-{d:06d}") for d in (1, 31, 32, 60, 2)]
    keys.append(shard_name(key("qwen-2"), "live", NOW - timedelta(days=90), "pod-b", "1-000001"))  # a prefix's twin
    bucket = Bucket(keys)
    assert sweep(S3Writer("captures", bucket), "live/team/qwen", NOW, 30) == (3, None)
    assert sorted(bucket.deleted) == sorted(keys[1:4])


def test_one_shard_that_cannot_go_does_not_keep_the_others(tmp_path: Path) -> None:
    keys = [shard_name(key(), "live", NOW - timedelta(days=d), "pod-a", f"1-{d:06d}") for d in (31, 32, 33)]

    class Locked(Bucket):
        def delete_object(self, Bucket: str, Key: str) -> None:
            if Key == keys[0]:  # the first listed: it would fail first every hour
                raise PermissionError("AccessDenied: object lock")
            super().delete_object(Bucket, Key)

    bucket = Locked(keys)
    gone, error = sweep(S3Writer("captures", bucket), "live/team/qwen", NOW, 30)
    assert (gone, sorted(bucket.deleted)) == (2, sorted(keys[1:]))
    assert isinstance(error, PermissionError)


def test_a_temporary_left_by_a_stopped_pod_expires_too(tmp_path: Path) -> None:
    name = shard(tmp_path, NOW - timedelta(days=31))
    temporary = (tmp_path / name).parent / f".{(tmp_path / name).name}.tmp"
    (tmp_path / name).rename(temporary)
    assert sweep(PvcWriter(tmp_path), "live/team/qwen", NOW, 30) == (1, None)
    assert not temporary.exists()


def settings_file(tmp_path: Path, **over: Any) -> LiveSettings:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({**SETTINGS, **over}))
    return LiveSettings(str(path), pod="", check_seconds=0)


def test_shards_expire_while_the_capture_is_off(tmp_path: Path) -> None:
    root = tmp_path / "claim"
    old = shard(root, NOW - timedelta(days=31))
    live = settings_file(tmp_path, enabled=False, pvcMount=str(root))
    assert live.current() is None  # off
    before = count(podcontract.CAPTURE_EXPIRED_METRIC)
    assert Retention(lambda: live.last_good, wall=lambda: NOW).once() == 1
    assert not (root / old).exists()
    assert count(podcontract.CAPTURE_EXPIRED_METRIC) == before + 1


def test_no_retention_days_no_sweep(tmp_path: Path) -> None:
    root = tmp_path / "claim"
    old = shard(root, NOW - timedelta(days=400))
    live = settings_file(tmp_path, retentionDays=None, pvcMount=str(root))
    assert Retention(lambda: live.last_good, wall=lambda: NOW).once() == 0
    assert (root / old).exists()
    assert Retention(lambda: None, wall=lambda: NOW).once() == 0


def test_a_failed_sweep_is_counted_and_the_next_one_tries_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = CaptureSettings.model_validate({**SETTINGS, "pvcMount": str(tmp_path)})
    unmounted = PvcWriter(tmp_path, mounted=True)  # a claim that is not mounted: nothing is listed or deleted there
    old = shard(tmp_path, NOW - timedelta(days=31))
    before = count(podcontract.CAPTURE_ERRORS_METRIC, kind="retention")
    retention = Retention(lambda: settings, writers=lambda k: (unmounted, "live"), wall=lambda: NOW)
    assert retention.once() == 0
    assert retention.once() == 0
    assert count(podcontract.CAPTURE_ERRORS_METRIC, kind="retention") == before + 2
    assert len([r for r in caplog.records if "not deleted" in r.getMessage()]) == 1  # said once while it fails
    assert (tmp_path / old).exists()
    mounted = Retention(lambda: settings, writers=lambda k: (PvcWriter(tmp_path), "live"), wall=lambda: NOW)
    assert mounted.once() == 1
