"""The rendered serving command, run for real: `speculator-operator serve` audits the draft, then runs the
vLLM CPU build with exactly the rendered arguments (mount points replaced by the local folders the
volumes would hold, the listen address by 127.0.0.1), and leaves a reasoned exit record when it fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from speculator_harness.cluster import free_port, tail
from speculator_operator.adapters.checkpoints import load_checkpoint
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.podcontract import REPORT_PATH_ENV, ServerExit, ServerExitReason
from speculator_operator.domain.releases import Release, get_release
from speculator_operator.pods.serve import LAUNCHER_ENV, PYTHON_ENV
from speculator_operator.render.serving import DRAFT_DIR, VERIFIER_DIR, Draft, Inputs, render

from .test_vllm_cpu import Server, post

pytestmark = pytest.mark.workloads


def pod_command(
    ckpt: Path, verifier: Path, release: Release | None = None, **serving: Any
) -> tuple[list[str], list[str]]:
    spec = SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "pvc://models/tiny-verifier"},
            "speculator": {"source": "pvc://models/draft"},
            # what a CPU needs, through the spec's own escape hatch
            "serving": {"extraArgs": ["--enforce-eager", "--max-model-len", "512"], "maxNumSeqs": 8, **serving},
        }
    )
    ck = load_checkpoint(str(ckpt))
    assert ck.algorithm is not None
    assert ck.speculative_tokens is not None
    r = render(Inputs("tiny", "default", spec, release or get_release(), Draft(ck.algorithm, ck.speculative_tokens)))
    (container,) = r.children[0]["spec"]["template"]["spec"]["containers"]
    port = str(free_port())

    def local(arg: str) -> str:
        return arg.replace(DRAFT_DIR, str(ckpt)).replace(VERIFIER_DIR, str(verifier))

    command = [local(a) for a in container["command"]]
    args = [local(a) for a in container["args"]]
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = port
    return command, args


class RenderedServer(Server):
    def __init__(self, vllm_env: Path, command: list[str], args: list[str], log: Path) -> None:
        self.port = int(args[args.index("--port") + 1])
        self.log = log
        self.record = log.with_name(log.name + ".termination-log")  # what the kubelet would show
        exe = str(Path(sys.executable).with_name(command[0]))
        env = {**os.environ, LAUNCHER_ENV: "api-server", PYTHON_ENV: str(vllm_env / "bin" / "python"),
               "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "OMP_NUM_THREADS": "2", REPORT_PATH_ENV: str(self.record)}  # fmt: skip
        with log.open("wb") as out:
            self.proc = subprocess.Popen([exe, *command[1:], *args], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)  # fmt: skip


@pytest.mark.parametrize("algo", ["eagle3", "dflash"])
def test_rendered_command_serves_with_spec_decode(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], tmp_path: Path, algo: str
) -> None:
    command, args = pod_command(dry_run_checkpoints[algo], dry_run_checkpoints["verifier"], cutoff={"maxBatchSize": 4})
    assert "num_speculative_tokens_per_batch_size" in args[args.index("--speculative-config") + 1]
    server = RenderedServer(vllm_env, command, args, tmp_path / "serve.log")
    try:
        server.wait_healthy()
        log = (tmp_path / "serve.log").read_text(errors="replace")
        assert "serve: audit ok" in log
        out = post(server.url("/v1/completions"), {"model": "tiny", "prompt": "the verifier", "max_tokens": 8})
        assert out["choices"]
        import urllib.request

        with urllib.request.urlopen(server.url("/metrics"), timeout=10) as resp:
            metrics = resp.read().decode()
        assert "vllm:spec_decode_num_draft_tokens_total" in metrics
        assert 'model_name="tiny"' in metrics
    finally:
        server.stop()


def test_a_draft_that_fails_the_audit_never_starts_vllm(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(dry_run_checkpoints["dflash"], bad)
    config = json.loads((bad / "config.json").read_text())
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 16
    (bad / "config.json").write_text(json.dumps(config))
    command, args = pod_command(bad, dry_run_checkpoints["verifier"])
    server = RenderedServer(vllm_env, command, args, tmp_path / "serve.log")
    try:
        assert server.wait_exit() == 1
        log = tail(tmp_path / "serve.log", 40)
        assert "speculative-tokens" in log
        assert "not starting vLLM" in log
        record = ServerExit.decode(server.record.read_text())
        assert record is not None
        assert record.reason is ServerExitReason.DRAFT_AUDIT_FAILED
    finally:
        server.stop()


def test_an_engine_that_refuses_its_arguments_leaves_engine_exited_with_the_cpu_platform(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """The real vLLM CPU build, started by the entrypoint with a context longer than the verifier's, exits at
    start-up: the entrypoint asks the same vLLM for its platform (cpu: a device it can use) and leaves
    EngineExited with vLLM's own status and the end of its output."""
    command, args = pod_command(dry_run_checkpoints["eagle3"], dry_run_checkpoints["verifier"])
    args[args.index("--max-model-len") + 1] = "100000"  # the tiny verifier has 512 positions
    server = RenderedServer(vllm_env, command, args, tmp_path / "serve.log")
    try:
        code = server.wait_exit()
        assert code != 0
        record = ServerExit.decode(server.record.read_text())
        assert record is not None, tail(tmp_path / "serve.log", 40)
        assert (record.reason, record.platform, record.exit_code) == (ServerExitReason.ENGINE_EXITED, "cpu", code)
        # vLLM's own last words end the record (the log holds them too, then the entrypoint's line)
        said = [line for line in (tmp_path / "serve.log").read_text(errors="replace").splitlines()
                if line.strip() and not line.startswith("serve: ")]  # fmt: skip
        assert record.message.endswith(said[-1].rstrip())
    finally:
        server.stop()
