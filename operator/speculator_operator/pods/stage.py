"""`speculator-operator stage SOURCE DEST [--revision REV] [--manifest FILES]` (an init container of the
serving and stage pods): copy exactly the audited files of a checkpoint (s3://, hf://, a claim) into the pod's
model volume, refusing any file that is not what was audited.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from pathlib import Path

from speculator_operator.adapters.sources import HfSource, S3Source, s3_client
from speculator_operator.domain.checkpoint.manifest import FileEntry, Kind, Manifest, s3_revision
from speculator_operator.domain.checkpoint.sources import SourceError
from speculator_operator.domain.location import Location


def stage(
    source: str, dest: str, revision: str | None = None, manifest: str | None = None, kind: Kind = "draft"
) -> int:
    """Copy a checkpoint into `dest`: exactly the audited files (`manifest`, from the pod template), each
    checked against its audited identity, size and sha256, or — without a manifest — the files that make
    up the checkpoint now, provided they still are `revision`. Exit 1 refuses (naming the file) anything
    that is not what was audited; exit 2 is bad usage. Idempotent: a marker records what was staged."""
    target = Path(dest)
    marker = target / ".staged"
    wanted = f"{source}@{revision or ''}"
    if marker.exists() and marker.read_text() == wanted:
        print(f"stage: {source} already in {dest}", file=sys.stderr)
        return 0
    try:
        files = Manifest.from_arg(manifest) if manifest else None
    except ValueError as exc:
        print(f"stage: {exc}", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    where = Location.parse(source)
    if where.is_s3:
        code = _stage_s3(source, target, revision, files, kind)
    elif where.is_hub:
        code = _stage_hub(source, target, revision, files, kind)
    elif where.is_pvc or (where.is_path and Path(where.path).is_absolute()):
        local = Path(where.root, where.path) if where.is_pvc else Path(where.path)
        shutil.copytree(local, target, dirs_exist_ok=True, symlinks=False)
        code = 0
    else:
        print(f"stage: unsupported source {source!r}", file=sys.stderr)
        return 2
    if code == 0:
        marker.write_text(wanted)
        print(f"stage: {source} -> {dest}", file=sys.stderr)
    return code


REFUSAL = "refusing to serve a pair that was not audited together"


def _stage_s3(source: str, target: Path, revision: str | None, files: Manifest | None, kind: Kind) -> int:
    where = Location.parse(source)
    found = S3Source(where.root, where.path, client=s3_client(), kind=kind)
    try:
        now = found.manifest
    except SourceError as exc:
        print(f"stage: {exc}", file=sys.stderr)
        return 1
    if files is None:
        if revision and s3_revision(now) != revision:
            print(
                f"stage: {source} is no longer revision {revision} (now {s3_revision(now)}); {REFUSAL}", file=sys.stderr
            )
            return 1
        files = now
    elif revision and revision.startswith("s3:") and s3_revision(files) != revision:
        print(f"stage: the manifest is not revision {revision}", file=sys.stderr)
        return 2
    if not files.files:
        print(f"stage: nothing under {source}", file=sys.stderr)
        return 1
    for entry in files.files:
        listed = now.get(entry.name)
        problem = None
        if listed is None:
            problem = "deleted after the audit"
        elif (listed.etag, listed.size) != (entry.etag, entry.size):
            audited, now_is = f"ETag {entry.etag}, {entry.size} bytes", f"ETag {listed.etag}, {listed.size} bytes"
            problem = f"replaced after the audit (audited {audited}; now {now_is})"
        else:
            problem = _download(found, entry, target)
        if problem:
            print(f"stage: {source}/{entry.name} is not the audited file: {problem}; {REFUSAL}", file=sys.stderr)
            return 1
    _keep_only(target, files)
    return 0


def _download(src: S3Source, entry: FileEntry, target: Path) -> str | None:
    """Fetch one object, pinned to its audited ETag, into `target`; why it is not the audited file, or None."""
    from botocore.exceptions import ClientError

    part = target / f".{entry.name}.partial"
    try:
        resp = src.client.get_object(Bucket=src.bucket, Key=src.key(entry.name), IfMatch=f'"{entry.etag}"')
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("PreconditionFailed", "412"):
            return f"replaced after the audit (its ETag is no longer {entry.etag})"
        if code in ("NoSuchKey", "404", "NotFound"):
            return "deleted after the audit"
        return f"cannot be read: {code or exc}"
    sha = hashlib.sha256()
    simple_md5 = re.fullmatch(r"[0-9a-f]{32}", entry.etag) is not None
    md5 = hashlib.md5(usedforsecurity=False)
    size = 0
    with part.open("wb") as fh:
        for chunk in resp["Body"].iter_chunks(1 << 20):
            fh.write(chunk)
            sha.update(chunk)
            if simple_md5:
                md5.update(chunk)
            size += len(chunk)
    problem = None
    if str(resp.get("ETag", "")).strip('"') not in ("", entry.etag):
        problem = f"the store sent ETag {resp['ETag']}, audited {entry.etag}"
    elif size != entry.size:
        problem = f"{size} bytes arrived, audited {entry.size}"
    elif entry.sha256 and sha.hexdigest() != entry.sha256:
        problem = f"sha256 {sha.hexdigest()}, the publish record says {entry.sha256}"
    elif simple_md5 and md5.hexdigest() != entry.etag:
        problem = f"MD5 {md5.hexdigest()} differs from its ETag: damaged in transit"
    if problem:
        part.unlink()
        return problem
    os.replace(part, target / entry.name)
    return None


def _keep_only(target: Path, files: Manifest) -> None:
    """Nothing but the audited files stays in the staging folder."""
    keep = {*files.names, ".staged"}
    for path in target.iterdir():
        if path.name not in keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _stage_hub(source: str, target: Path, revision: str | None, files: Manifest | None, kind: Kind) -> int:
    """The audited files at the pinned commit (a commit names its bytes), one by one; the sha256 the hub
    lists for large (LFS) files is checked."""
    from huggingface_hub import hf_hub_download

    where = Location.parse(source)
    repo = where.root
    pinned = revision or where.revision or None
    if files is None:
        try:
            files = HfSource(repo, pinned, kind=kind).manifest
        except SourceError as exc:
            print(f"stage: {exc}", file=sys.stderr)
            return 1
    for entry in files.files:
        try:
            fetched = hf_hub_download(
                repo,
                entry.name,
                revision=pinned,
                local_dir=str(target),
                endpoint=os.environ.get("HF_ENDPOINT") or None,
                token=os.environ.get("HF_TOKEN") or None,
            )
            path = Path(fetched)
        except Exception as exc:  # huggingface_hub raises many types: all mean "not there at this commit"
            first = str(exc).splitlines()[0] if str(exc) else ""
            why = f"cannot be fetched at {pinned}: {type(exc).__name__}: {first}"
            print(f"stage: {source}/{entry.name} {why}; {REFUSAL}", file=sys.stderr)
            return 1
        if entry.sha256 and _sha256(path) != entry.sha256:
            why = f"is not the audited file: its sha256 is not {entry.sha256}"
            print(f"stage: {source}/{entry.name} {why}; {REFUSAL}", file=sys.stderr)
            return 1
    _keep_only(target, files)
    return 0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
