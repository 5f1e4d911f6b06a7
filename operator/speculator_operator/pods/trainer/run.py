"""What runs inside a SpeculatorTrainJob's pods (the trainer image): `speculator-operator trainer ...`.

- `fetch`: stage the verifier at its resolved revision and the s3:// / pvc:// data into the workspace.
- `run --stage S -- CMD...`: run the real tool (`speculators ...`, `torchrun ...`), forward SIGTERM to
  it (speculators saves `interrupted/` on SIGTERM), and on success leave a JSON report as the
  container's termination message (samples, epoch, data fingerprint) for the operator's status.
  On failure nothing is written, so Kubernetes keeps the log tail instead (FallbackToLogsOnError).
- `audit CKPT --verifier DIR [--release R]`: audit the trained checkpoint with the audit core;
  exit 1 on errors, 2 when it cannot be read.
- `publish CKPT TARGET ...`: publish to a location no later run overwrites: under s3:// and mounted
  folders a content-addressed folder `TARGET/sha256-<digest>` (the files, then the provenance record
  with every file's sha256 and size, then the `speculators-latest.json` pointer at TARGET), on the hub
  one commit whose message names the verifier revision; reports the exact location and the digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from speculator_operator import __version__
from speculator_operator.api.podcontract import StageReport, progress_seconds, report_path
from speculator_operator.domain.algorithms import Algorithm, Family, in_family
from speculator_operator.domain.checkpoint import CheckpointError, audit, checkpoint_dir, load_verifier_config
from speculator_operator.domain.checkpoint.manifest import LATEST
from speculator_operator.domain.checkpoint.manifest import PROVENANCE as MARKER
from speculator_operator.domain.checkpoint.safetensors_header import header_length, parse_header
from speculator_operator.domain.releases import get_release
from speculator_operator.pods import progress
from speculator_operator.pods.entrypoints import stage as stage_copy

SKIP_ON_PUBLISH = re.compile(r"^(optimizer|scheduler)_state_dict\.pt$")


def report(stage: str, **fields: Any) -> None:
    """Write the stage's report where the kubelet reads the termination message."""
    path = Path(report_path())
    text = StageReport.model_validate({"stage": stage, **fields}).encode()
    try:
        path.write_text(text)
    except OSError as exc:
        print(f"trainer: cannot write the report to {path}: {exc}", file=sys.stderr)


def _flag(command: list[str], name: str) -> str | None:
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _expand(command: list[str]) -> list[str]:
    """$(JOB_COMPLETION_INDEX) is expanded by the kubelet; expand it here too when run by hand."""
    index = os.environ.get("JOB_COMPLETION_INDEX", "0")
    return [a.replace("$(JOB_COMPLETION_INDEX)", index) for a in command]


# ---- run -----------------------------------------------------------------------------------------------


def run(stage: str, command: list[str], held_out: tuple[int, str] | None = None) -> int:
    """Run the stage's tool; `held_out` (prepare only): split that many samples off into that file."""
    if not command:
        print("trainer run: no command after --", file=sys.stderr)
        return 2
    command = _expand(command)
    if stage == "stitch":
        try:
            command = _stitched_from(command)
        except CheckpointError as exc:
            print(f"trainer: stage stitch: {exc}", file=sys.stderr)
            return 2
    print(f"trainer: stage {stage}: {' '.join(command)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    tracker = _tracker(stage, command)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "1000")}  # rich wraps at 80 without a terminal
    try:
        # the rendered command of this stage; its output is read on its way through to the log (see _relay)
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    except OSError as exc:
        print(f"trainer: cannot start {command[0]}: {exc}", file=sys.stderr)
        return 2
    unfilled: list[str] = []
    readers = [
        threading.Thread(target=_relay, args=(stream, sink, tracker, unfilled), daemon=True)
        for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
    ]
    for reader in readers:
        reader.start()
    stop = threading.Event()
    ticker = threading.Thread(target=_report_progress, args=(tracker, stop), daemon=True)
    ticker.start()

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    for reader in readers:
        reader.join(timeout=60)
    stop.set()
    ticker.join(timeout=10)
    tracker.poll()
    print(tracker.render(), file=sys.stderr, flush=True)
    if code != 0:
        print(f"trainer: stage {stage} exited with {code}", file=sys.stderr)
        return code if code > 0 else 128 - code
    if unfilled:
        print(f"trainer: stage convert: the converter loaded the source only in part, so the draft it saved holds "
              f"weights the source did not give; {'; '.join(unfilled)}", file=sys.stderr)  # fmt: skip
        return 1
    if stage == "convert":
        for note in causal_as_trained(Path(_flag(command, "--output-path") or "converted")):
            print(f"trainer: stage convert: {note}", file=sys.stderr)
    extra: dict[str, Any] = {}
    if held_out is not None:
        from speculator_operator.pods.holdout import EvaluationError, hold_out

        try:
            kept, held = hold_out(Path(_flag(command, "--output") or "./output"), held_out[0], Path(held_out[1]))
        except EvaluationError as exc:
            print(f"trainer: stage {stage}: {exc}", file=sys.stderr)
            return 2
        print(f"trainer: stage {stage}: {held} sample(s) held out for evaluate, {kept} to train on", file=sys.stderr)
        extra = {"samples": kept, "heldOut": held}  # dataset_info.json may still count the rows before the split
    report(stage, seconds=round(time.monotonic() - t0, 1), **{**outcome(stage, command), **extra})
    return 0


# speculators 0.9.0's eagle3 converter loads the source with strict=False and only warns about what did not fit
# (convert/eagle/eagle3_converter.py _save_converted_checkpoint): a tensor the source lacks stays randomly
# initialised, and one it has that the draft does not use is dropped.
_PARTIAL_LOAD = re.compile(r"(Missing|Unexpected) keys in checkpoint: (.*)")


def _relay(stream: IO[str], sink: IO[str], tracker: progress.Tracker, unfilled: list[str]) -> None:
    """Copy one of the tool's streams through, feeding the progress tracker and noting each part of a
    source the converter could not place."""
    for line in stream:
        sink.write(line)
        sink.flush()
        tracker.line(line)
        match = _PARTIAL_LOAD.search(line)
        if match and tracker.stage == "convert":
            unfilled.append(f"{match[1].lower()} keys: {match[2][:300]}")


PROGRESS_SECONDS = progress_seconds()


def _report_progress(tracker: progress.Tracker, stop: threading.Event) -> None:
    """Print the stage's progress line when it changed, every PROGRESS_SECONDS (the operator reads the last)."""
    last = ""
    while not stop.wait(PROGRESS_SECONDS):
        tracker.poll()
        line = tracker.render()
        if line != last:
            print(line, file=sys.stderr, flush=True)
            last = line


def _tracker(stage: str, command: list[str]) -> progress.Tracker:
    limit = _flag(command, "--limit")
    total = int(limit) if limit and limit.isdigit() else None
    if stage == "regenerate":
        return progress.Tracker(stage, total, Path(_flag(command, "--outfile") or "data.jsonl"))
    if stage == "extract":
        samples = _flag(command, "--max-samples")
        return progress.Tracker(stage, int(samples) if samples and samples.isdigit() else None,
                                Path(_flag(command, "--output") or "."))  # fmt: skip
    return progress.Tracker(stage)


def causal_as_trained(folder: Path) -> list[str]:
    """A converted DFlash draft whose layers all have full attention (z-lab's own drafts) was trained
    non-causal inside each block, and speculators runs full attention non-causal whatever its
    sliding_window_non_causal says; vLLM 0.32.0 instead reads that flag for every layer (dflash_config.causal =
    not the flag) and would serve the draft causal. The converter writes the flag false: it is set true, which
    changes nothing for speculators and makes vLLM serve the draft as it was trained. Returns what was done."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    layers = (config.get("transformer_layer_config") or {}).get("layer_types")
    if (
        not in_family(config.get("speculators_model_type"), Family.DFLASH)
        or config.get("speculators_model_type") == Algorithm.XPRESS
        or config.get("sliding_window_non_causal") is not False
        or not isinstance(layers, list)
        or not layers
        or "sliding_attention" in layers
    ):
        return []
    config["sliding_window_non_causal"] = True
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [
        f"sliding_window_non_causal set true: all {len(layers)} layers have full attention, which the source "
        "and speculators run non-causal and vLLM serves causal under false"
    ]


# speculators 0.9.0's MTP converter saves `verifier_lm_head.weight` (a frozen copy of the verifier's head) with
# the MTP layers, and stitch-mtp skips only embed_tokens and lm_head (cli/stitch.py _FROZEN_KEYS): the copy
# lands in the stitched model, where vLLM 0.32.0 finds no such parameter and refuses to load it (seen here).
# They are the verifier's own weights, never trained: left out of what is stitched.
NOT_STITCHED = re.compile(r"^verifier_(lm_head|norm)\.")


def _stitched_from(command: list[str]) -> list[str]:
    """`speculators stitch-mtp ROOT ...` with ROOT resolved to the run's checkpoint (best, last epoch, or the
    folder a dry run or a convert wrote), less the verifier's frozen copies (NOT_STITCHED)."""
    if command[:2] != ["speculators", "stitch-mtp"] or len(command) < 3:
        return command
    root = Path(command[2])
    folder = checkpoint_dir(root)
    clean = root.with_name(root.name + "-stitch-input")
    dropped = copy_without(folder, clean, NOT_STITCHED)
    if dropped:
        print(f"trainer: stage stitch: left out the verifier's frozen {', '.join(dropped)}", file=sys.stderr)
        folder = clean
    return [*command[:2], str(folder), *command[3:]]


def copy_without(folder: Path, dest: Path, names: re.Pattern[str]) -> list[str]:
    """Copy a single-file checkpoint to `dest` without the tensors whose names match (a byte copy of the
    others, their header rewritten); returns what was left out, and copies nothing when that is none."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return []  # sharded: stitch-mtp reads it as it is
    with weights.open("rb") as fh:
        prefix = fh.read(8)
        size = weights.stat().st_size
        raw = fh.read(header_length(prefix, str(weights), size))
    tensors, metadata = parse_header(raw, str(weights), size)
    dropped = sorted(n for n in tensors if names.match(n))
    if not dropped:
        return []
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("model.safetensors"))
    kept = sorted((t for n, t in tensors.items() if n not in dropped), key=lambda t: t.start)
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for t in kept:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    table = json.dumps(header, separators=(",", ":")).encode()
    table += b" " * (-len(table) % 8)
    with weights.open("rb") as src, (dest / "model.safetensors").open("wb") as out:
        out.write(len(table).to_bytes(8, "little") + table)
        for t in kept:
            src.seek(t.start)
            out.write(src.read(t.nbytes))
    return dropped


def outcome(stage: str, command: list[str]) -> dict[str, Any]:
    """What the status shows for a finished stage, read from what the tool wrote."""
    if stage == "prepare":
        out = Path(_flag(command, "--output") or "./output")
        return {"samples": _dataset_rows(out), "fingerprint": _dataset_fingerprint(out)}
    if stage == "extract":
        out = Path(_flag(command, "--output") or "")
        return {"samples": len(list(out.glob("hs_*.safetensors"))) if out.is_dir() else None}
    if stage == "regenerate":
        out = Path(_flag(command, "--outfile") or "")
        return {"samples": sum(1 for _ in out.open()) if out.is_file() else None}
    if stage in ("convert", "stitch"):
        out = Path(_flag(command, "--output-path") or "")
        return {
            "checkpoint": str(out),
            "files": sum(1 for p in out.rglob("*") if p.is_file()) if out.is_dir() else None,
        }
    if stage == "train":
        save = Path(_flag(command, "--save-path") or "")
        epochs = [int(p.name) for p in save.iterdir() if p.name.isdigit()] if save.is_dir() else []
        return {"epoch": max(epochs) + 1 if epochs else (0 if "--dry-run" in command else None)}
    return {}


def _dataset_fingerprint(out: Path) -> str | None:
    state = out / "state.json"
    try:
        value = json.loads(state.read_text()).get("_fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def _dataset_rows(out: Path) -> int | None:
    try:
        info = json.loads((out / "dataset_info.json").read_text())
        splits = info.get("splits") or {}
        if splits:
            return int(sum(s.get("num_examples", 0) for s in splits.values()))
    except (OSError, ValueError, AttributeError):
        pass
    try:
        from datasets import load_from_disk  # type: ignore[import-not-found]  # in the trainer image

        return len(load_from_disk(str(out)))
    except Exception:  # a count is informative only
        return None


# ---- fetch ---------------------------------------------------------------------------------------------


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
    if source.startswith("s3://"):
        import boto3

        bucket, _, key = source.removeprefix("s3://").partition("/")
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


# ---- audit ---------------------------------------------------------------------------------------------


def audit_checkpoint(root: str, verifier: str, release_name: str | None) -> int:
    try:
        folder = checkpoint_dir(Path(root))
        verifier_config, _ = load_verifier_config(verifier)
        release = get_release(release_name) if release_name else None
        result = audit(str(folder), verifier=verifier_config, release=release)
    except CheckpointError as exc:
        print(f"trainer audit: {exc}", file=sys.stderr)
        return 2
    for f in result.findings:
        print(f"audit {f.severity} {f.rule}: {f.message}", file=sys.stderr)
    findings = [f.as_dict() for f in result.findings if f.severity != "info"]
    warnings = sum(1 for f in result.findings if f.severity == "warning")
    summary = {"ok": result.ok, "errors": len(result.errors), "warnings": warnings, "findings": findings[:20]}
    if not result.ok:
        first = result.errors[0]
        # the termination message of a failed pod: the operator quotes it in the status
        print(f"audit failed: {len(result.errors)} error(s); first: {first.rule}: {first.message}", file=sys.stderr)
        return 1
    report("audit", checkpoint=str(folder), audit=summary, algorithm=result.checkpoint.algorithm)
    return 0


# ---- publish -------------------------------------------------------------------------------------------


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
) -> int:
    """Publish the audited checkpoint to its own immutable location under `target` (`uri` is how the
    user named a mounted folder target, e.g. pvc://claim/path) and report that location and the digest;
    `evaluation`, the evaluate stage's measure, goes into the provenance record."""
    try:
        folder = checkpoint_dir(Path(root))
        files = _payload(folder, verifier)
        records = file_records(files)
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"trainer publish: {exc}", file=sys.stderr)
        return 2
    release = get_release(release_name)
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
        "files": records,
        "published": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    marker = {k: v for k, v in marker.items() if v is not None}
    try:
        if target.startswith("s3://"):
            location = _publish_s3(target, files, marker)
        elif target.startswith("hf://"):
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

    bucket, _, prefix = target.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
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

    repo = target.removeprefix("hf://").split("@")[0]
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
