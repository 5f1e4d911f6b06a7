"""`trainer publish CKPT TARGET ...`: publish to a location no later run overwrites: under s3:// and mounted
folders a content-addressed folder `TARGET/sha256-<digest>` (the files, then the provenance record with every
file's sha256 and size, then the `speculators-latest.json` pointer at TARGET), on the hub one commit whose
message names the verifier revision; reports the exact location and the digest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speculator_operator import __version__
from speculator_operator.adapters.checkpoints import checkpoint_dir
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.checkpoint.manifest import LATEST
from speculator_operator.domain.checkpoint.manifest import PROVENANCE as MARKER
from speculator_operator.domain.location import Location
from speculator_operator.domain.releases import pod_release
from speculator_operator.domain.sweep import Curve
from speculator_operator.pods.trainer.report import report


def _payload(folder: Path, verifier: str) -> dict[str, bytes | Path]:
    """The files to publish (symlinks dereferenced, optimizer state left out); config.json names the
    verifier by its real identity instead of the pod-local path the trainer was given."""
    files: dict[str, bytes | Path] = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or SKIP_ON_PUBLISH.match(path.name) or path.name == MARKER:
            continue
        rel = path.relative_to(folder).as_posix()
        if rel == "config.json":
            config = json.loads(path.read_text())
            ver = (config.get("speculators_config") or {}).get("verifier")
            if isinstance(ver, dict):
                ver["name_or_path"] = verifier
            files[rel] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
        else:
            files[rel] = path
    if "config.json" not in files:
        raise CheckpointError(f"{folder}: no config.json to publish")
    return files


SKIP_ON_PUBLISH = re.compile(r"^(optimizer|scheduler)_state_dict\.pt$")  # training state, not the draft


def _sha(content: bytes | Path) -> str:
    h = hashlib.sha256()
    if isinstance(content, bytes):
        h.update(content)
    else:
        with content.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def file_records(files: dict[str, bytes | Path]) -> dict[str, dict[str, Any]]:
    """{name: {sha256, size}} of every published file: what the provenance record carries and the stage
    init container checks."""
    return {
        name: {"sha256": _sha(c), "size": len(c) if isinstance(c, bytes) else c.stat().st_size}
        for name, c in sorted(files.items())
    }


def _digest_of(records: dict[str, dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for name in sorted(records):
        h.update(f"{name}\0{records[name]['sha256']}\n".encode())
    return "sha256:" + h.hexdigest()


def digest(files: dict[str, bytes | Path]) -> str:
    """sha256 over the sorted (name, sha256 of content) pairs: the same files give the same digest."""
    return _digest_of(file_records(files))


def location_name(checkpoint_digest: str) -> str:
    """The folder under output.uri that a checkpoint with this digest is published to (content-addressed:
    a later run never writes into an earlier one's folder; the same bytes land in the same place)."""
    return "sha256-" + checkpoint_digest.removeprefix("sha256:")[:16]


def _same_target(record: dict[str, Any], marker: dict[str, Any]) -> bool | None:
    """Whether an existing publish record is this publish (True), another one (False), or absent (None)."""
    if not record:
        return None
    keys = ("digest", "verifier", "verifierRevision")
    return all(record.get(k) == marker.get(k) for k in keys)


def _candidates(marker: dict[str, Any]) -> list[str]:
    """Where this publish may go: its content-addressed name, or — when the same bytes were published for
    another verifier revision (a dry run's draft can be) — that name plus a tag of the verifier revision."""
    name = location_name(marker["digest"])
    target = hashlib.sha256(f"{marker['verifier']}@{marker['verifierRevision']}".encode()).hexdigest()[:8]
    return [name, f"{name}-{target}"]


def publish(
    root: str,
    target: str,
    verifier: str,
    verifier_revision: str,
    job: str,
    release_name: str,
    verifier_content: str | None = None,
    uri: str | None = None,
    evaluation: dict[str, Any] | None = None,
    sweep: dict[str, Any] | None = None,
) -> int:
    """Publish the audited checkpoint to its own immutable location under `target` (`uri` is how the
    user named a mounted folder target, e.g. pvc://claim/path) and report that location and the digest;
    `evaluation`, the evaluate stage's measure, and `sweep`, the sweep's whole curve (checked against the digest
    the evaluation's summary names), go into the provenance record."""
    try:
        if sweep is not None:
            curve = Curve.from_wire(sweep)
            named = ((evaluation or {}).get("sweep") or {}).get("digest")
            if named != curve.digest():
                raise ValueError(f"the sweep's curve is {curve.digest()}, the evaluation names {named}")
            sweep = curve.wire()
        folder = checkpoint_dir(Path(root))
        files = _payload(folder, verifier)
        records = file_records(files)
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"trainer publish: {exc}", file=sys.stderr)
        return 2
    release = pod_release(release_name)
    sha = _digest_of(records)
    config = files["config.json"]
    algorithm = json.loads(config).get("speculators_model_type") if isinstance(config, bytes) else None
    marker = {
        "digest": sha,
        "job": job,
        "verifier": verifier,
        "verifierRevision": verifier_revision,
        "verifierContent": verifier_content,
        "algorithm": algorithm,
        "release": release.name,
        "speculators": release.speculators,
        "hsConnectors": release.hs_connectors,
        "vllm": release.vllm,
        "operator": __version__,
        "output": uri or target,
        "evaluation": evaluation,
        "sweep": sweep,
        "files": records,
        "published": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    marker = {k: v for k, v in marker.items() if v is not None}
    try:
        where = Location.parse(target)
        if where.is_s3:
            location = _publish_s3(target, files, marker)
        elif where.is_hub:
            message = f"{algorithm} draft for {verifier}@{verifier_revision} ({job})"
            location = _publish_hub(target, files, marker, message)
        else:
            location = _publish_folder(Path(target), (uri or target).rstrip("/"), files, marker)
    except PublishError as exc:
        print(f"trainer publish: {exc}", file=sys.stderr)
        return 1
    print(f"trainer publish: {sha} -> {location}", file=sys.stderr)
    report("publish", uri=location, digest=sha)
    return 0


def _pointer(marker: dict[str, Any], name: str) -> bytes:
    """`speculators-latest.json` at output.uri: the location the newest publish went to."""
    keys = ("location", "digest", "job", "verifier", "verifierRevision", "published")
    return json.dumps({"name": name, **{k: marker.get(k) for k in keys}}, indent=2).encode()


class PublishError(Exception):
    """Nowhere to publish without overwriting someone else's checkpoint."""


def _publish_s3(target: str, files: dict[str, bytes | Path], marker: dict[str, Any]) -> str:
    """Every file into a new location, its provenance record last (a location without one is not whole),
    then the pointer at output.uri. A re-run of the same publish finds it already there."""
    import boto3
    from botocore.exceptions import ClientError

    where = Location.parse(target)
    bucket, prefix = where.root, where.path.strip("/")
    s3 = boto3.client("s3")
    for name in _candidates(marker):
        location = f"{prefix}/{name}" if prefix else name
        try:
            existing = json.loads(s3.get_object(Bucket=bucket, Key=f"{location}/{MARKER}")["Body"].read())
        except ClientError:
            existing = {}
        same = _same_target(existing, marker)
        if same is False:
            continue  # someone else's publish: never overwritten
        uri = f"s3://{bucket}/{location}"
        if same is None:
            for fname, content in files.items():
                key = f"{location}/{fname}"
                if isinstance(content, bytes):
                    s3.put_object(Bucket=bucket, Key=key, Body=content)
                else:
                    s3.upload_file(str(content), bucket, key)
            record = json.dumps({**marker, "location": uri}, indent=2).encode()
            s3.put_object(Bucket=bucket, Key=f"{location}/{MARKER}", Body=record)
        pointer = f"{prefix}/{LATEST}" if prefix else LATEST
        s3.put_object(Bucket=bucket, Key=pointer, Body=_pointer({**marker, "location": uri}, name))
        return uri
    raise PublishError(f"every location for {marker['digest']} under {target} holds another publish")


def _publish_hub(target: str, files: dict[str, bytes | Path], marker: dict[str, Any], message: str) -> str:
    """One commit (atomic); the commit sha names the bytes, the branch is the pointer."""
    from huggingface_hub import CommitOperationAdd, HfApi

    repo = Location.parse(target).root
    api = HfApi()
    api.create_repo(repo, exist_ok=True, private=True)
    ops = [
        CommitOperationAdd(path_in_repo=n, path_or_fileobj=c if isinstance(c, bytes) else str(c))
        for n, c in files.items()
    ]
    ops.append(CommitOperationAdd(path_in_repo=MARKER, path_or_fileobj=json.dumps(marker, indent=2).encode()))
    commit = api.create_commit(repo, operations=ops, commit_message=message)
    return f"hf://{repo}@{commit.oid}"


def _publish_folder(target: Path, uri: str, files: dict[str, bytes | Path], marker: dict[str, Any]) -> str:
    """A new folder made whole beside the others and renamed into place, then the pointer (a rename too).
    Nothing already published is replaced; `uri` is how the user names `target` (pvc://claim/path)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in _candidates(marker):
        final = target / name
        try:
            existing = json.loads((final / MARKER).read_text())
        except (OSError, ValueError):
            existing = {}
        same = _same_target(existing if isinstance(existing, dict) else {}, marker)
        if same is False:
            continue
        location = f"{uri}/{name}"
        if same is None:
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target))
            for fname, content in files.items():
                (tmp / fname).parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    (tmp / fname).write_bytes(content)
                else:
                    shutil.copyfile(content, tmp / fname)
            (tmp / MARKER).write_text(json.dumps({**marker, "location": location}, indent=2))
            tmp.chmod(0o755)
            if final.exists():  # a partial folder that never got its record
                shutil.rmtree(final)
            tmp.rename(final)  # same filesystem: the folder appears whole
        pointer = target / f".{LATEST}.tmp"
        pointer.write_bytes(_pointer({**marker, "location": location}, name))
        os.replace(pointer, target / LATEST)
        return location
    raise PublishError(f"every location for {marker['digest']} under {uri} holds another publish")
