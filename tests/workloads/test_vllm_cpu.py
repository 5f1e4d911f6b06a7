"""The pinned vLLM (its CPU build) against what the release table and the audit say about it:
a speculators dry-run draft is served with the long-form speculative config and the load cut-off,
spec-decode metrics are exported, and `disable_by_batch_size` stops the server at start-up, as does a DFlash2
draft (the V1 runner the CPU build runs has no candidate head)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from speculator_harness.cluster import CACHE, free_port, tail
from speculator_operator.domain.economics import schedule_from_cutoff
from speculator_operator.domain.releases import get_release, supports
from speculator_operator.telemetry.vllm_metrics import parse_sample

from ..xstate import XTILEDATA, held_at_start, offered, on_x86_64_linux

pytestmark = pytest.mark.workloads

STARTUP_TIMEOUT = 480.0


class Server:
    def __init__(self, env: Path, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.log = log
        argv = [str(env / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                "--port", str(self.port), *args]  # fmt: skip
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                     "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "2"},
            )  # fmt: skip

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited with {self.proc.returncode}:\n{tail(self.log, 40)}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise AssertionError(f"vLLM not healthy within {STARTUP_TIMEOUT} s:\n{tail(self.log, 40)}")

    def wait_exit(self) -> int:
        return self.proc.wait(STARTUP_TIMEOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        result: dict[str, object] = json.loads(resp.read())
        return result


def base_args(verifier: Path) -> list[str]:
    return ["--model", str(verifier), "--served-model-name", "tiny-verifier", "--max-model-len", "512",
            "--max-num-seqs", "8", "--enforce-eager"]  # fmt: skip


@pytest.fixture
def server_log(tmp_path: Path) -> Path:
    return tmp_path / "vllm.log"


@pytest.mark.host
def test_the_vllm_environments_processes_hold_the_amx_tile_state(vllm_env: Path) -> None:
    """hack/workloads-env installs hack/lib/amx-permission.pth, so vLLM's AMX kernels do not trap
    (docs/performance/vllm-cpu-amx.md); the server image gets the same file, checked by the node tier's serving."""
    if not on_x86_64_linux() or not offered() & XTILEDATA:
        pytest.skip("this CPU or kernel offers no AMX tile state: vLLM takes its non-AMX kernels")
    assert held_at_start(vllm_env / "bin" / "python") & XTILEDATA


def test_pinned_vllm_serves_a_speculators_draft_with_the_cut_off(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], server_log: Path
) -> None:
    release = get_release()
    assert supports(release.vllm_version, "num_speculative_tokens_per_batch_size")
    schedule = schedule_from_cutoff(3, max_batch_size=4, max_num_seqs=8).as_list()
    spec = {"method": "eagle3", "model": str(dry_run_checkpoints["eagle3"]), "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": schedule}  # fmt: skip
    server = Server(vllm_env, [*base_args(dry_run_checkpoints["verifier"]), "--speculative-config", json.dumps(spec)],
                    server_log)  # fmt: skip
    try:
        server.wait_healthy()
        log = server_log.read_text(errors="replace")
        assert "Eagle3" in log  # the draft was resolved as an EAGLE-3 drafter, not a plain draft model
        out = post(
            server.url("/v1/completions"),
            {"model": "tiny-verifier", "prompt": "the draft predicts", "max_tokens": 16, "temperature": 0},
        )
        assert out["choices"][0]["text"] is not None  # type: ignore[index]
        with urllib.request.urlopen(server.url("/metrics"), timeout=10) as resp:
            metrics = resp.read().decode()
        for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_total"):  # fmt: skip
            assert name in metrics
        assert 'model_name="tiny-verifier"' in metrics
        drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_draft_tokens_total")]
        assert any(float(line.rsplit(" ", 1)[1]) > 0 for line in drafts), drafts
        # recorded for bench/acceptance.py, whose stand-ins answer with it
        recorded = CACHE / "recorded" / f"vllm-{release.vllm_version}-cpu-metrics.txt"
        recorded.parent.mkdir(parents=True, exist_ok=True)
        recorded.write_text(metrics)
        # the operator's parser reads real vLLM's text: K positions, and counters that add up
        sample = parse_sample(metrics)
        assert sample.drafts > 0
        assert sample.draft_tokens == 3 * sample.drafts  # K = 3 below the cut-off (one request at a time)
        assert 0 <= sample.accepted <= sample.draft_tokens
        assert len(sample.per_position) == 3
        assert sum(sample.per_position) == sample.accepted  # each accepted token counted at its position
        assert list(sample.per_position) == sorted(sample.per_position, reverse=True)
        assert sample.generated > 0
    finally:
        server.stop()


def test_pinned_vllm_refuses_disable_by_batch_size(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], server_log: Path
) -> None:
    release = get_release()
    assert not supports(release.vllm_version, "disable_by_batch_size")
    spec = {"method": "eagle3", "model": str(dry_run_checkpoints["eagle3"]), "num_speculative_tokens": 3,
            "disable_by_batch_size": 4}  # fmt: skip
    log = refused_at_start(vllm_env, dry_run_checkpoints["verifier"], spec, server_log)
    assert "disable_by_batch_size" in log
    assert "ValidationError" in log or "Unexpected keyword argument" in log


def refused_at_start(vllm_env: Path, verifier: Path, spec: dict[str, object], log: Path) -> str:
    """Start vLLM with this speculative config; it must exit without serving. Returns its log."""
    server = Server(vllm_env, [*base_args(verifier), "--speculative-config", json.dumps(spec)], log)
    try:
        assert server.wait_exit() != 0
        return log.read_text(errors="replace")
    finally:
        server.stop()


def test_the_cpu_build_refuses_a_dflash2_draft_rather_than_drop_its_candidate_head(
    vllm_env: Path, dry_run_checkpoints: dict[str, Path], server_log: Path
) -> None:
    """DFlash2's candidate head runs only in vLLM's V2 model runner; without Triton the CPU build runs V1,
    which refuses the draft at start-up (config/vllm.py) instead of drafting without the head. Serving a
    DFlash2 is therefore a GPU check; the audit says so (vllm-runner)."""
    spec = {"method": "dflash", "model": str(dry_run_checkpoints["dflash2"]), "num_speculative_tokens": 7}
    log = refused_at_start(vllm_env, dry_run_checkpoints["verifier"], spec, server_log)
    assert "Model Runner V1 does not support: DFlash candidate-head drafts" in log
