"""`trainer fetch`: stage the verifier at its resolved revision and the s3:// / pvc:// data into the workspace
(and, for a conversion, the third-party draft)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from speculator_operator.domain.location import Location
from speculator_operator.pods.stage import stage as stage_copy
from speculator_operator.pods.trainer.report import report


def fetch(
    verifier: str,
    dest: str,
    revision: str | None,
    data: list[str],
    convert: str | None = None,
    convert_revision: str | None = None,
) -> int:
    code = stage_copy(verifier, dest, revision, kind="verifier")
    if code != 0:
        return code
    files = 0
    for pair in data:
        source, sep, target = pair.partition("=")
        if not sep:
            print(f"trainer fetch: --data wants SOURCE=DEST, got {pair!r}", file=sys.stderr)
            return 2
        files += _fetch_data(source, Path(target))
    if convert:
        source, sep, target = convert.partition("=")
        if not sep:
            print(f"trainer fetch: --convert wants SOURCE=DEST, got {convert!r}", file=sys.stderr)
            return 2
        # a third-party layout: its config, weights (safetensors, else pytorch_model.bin) and tokenizer files
        code = stage_copy(source, target, convert_revision, kind="verifier")
        if code != 0:
            return code
    report("fetch", verifier=dest, revision=revision, dataFiles=files, converted=convert and convert.partition("=")[0])
    return 0


def _fetch_data(source: str, target: Path) -> int:
    """Copy one data source (an object, a prefix, a file or a folder) to `target`."""
    where = Location.parse(source)
    if where.is_s3:
        import boto3

        bucket, key = where.root, where.path
        s3 = boto3.client("s3")
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            keys += [o["Key"] for o in page.get("Contents", [])]
        if keys == [key]:  # one object
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(target))
            return 1
        prefix = key.rstrip("/") + "/"
        count = 0
        for k in keys:
            rel = k[len(prefix) :] if k.startswith(prefix) else ""
            if not rel or rel.endswith("/") or ".." in Path(rel).parts:
                continue
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, k, str(target / rel))
            count += 1
        if not count:
            raise SystemExit(f"trainer fetch: nothing at {source}")
        return count
    src = Path(source)
    if src.is_dir():
        shutil.copytree(src, target, dirs_exist_ok=True)
        return sum(1 for p in target.rglob("*") if p.is_file())
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, target)
    return 1
