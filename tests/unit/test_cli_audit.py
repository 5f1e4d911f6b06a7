"""`speculator-operator audit`: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..ckptgen import QWEN3_8B, dflash, eagle3, mutate, write_checkpoint


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "speculator_operator.cli", *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.fixture
def verifier_file(tmp_path: Path) -> Path:
    path = tmp_path / "verifier.json"
    path.write_text(json.dumps(QWEN3_8B))
    return path


def test_good_checkpoint_json(tmp_path: Path, verifier_file: Path) -> None:
    write_checkpoint(tmp_path / "ck", *eagle3())
    out = cli("audit", str(tmp_path / "ck"), "--verifier-config", str(verifier_file), "--format", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    ck = report["checkpoint"]
    assert ck["algorithm"] == "eagle3"
    assert ck["speculators_version"] == "0.9.0"
    assert ck["hidden_size"] == 4096
    assert ck["draft_vocab_size"] == 32000
    assert ck["verifier_vocab_size"] == 151936
    assert ck["aux_layer_ids"] == [2, 18, 33]
    assert ck["speculative_tokens"] == 3
    assert 0 < ck["bytes_read"] < 10_000 < ck["bytes_on_disk"]
    assert report["release"]
    assert report["vllm"]
    assert all(set(f) == {"rule", "severity", "message"} for f in report["findings"])
    econ = report["economics"]
    # no --device-class: the prior for an unknown GPU prices the draft, well above its parameter share
    assert (econ["cost_source"], econ["prior"]) == ("prior", "default")
    assert 0 < econ["parameter_ratio"] < 0.08 < 0.1 < econ["cost_ratio"] < 0.2
    assert 0 < econ["break_even_acceptance"] < 0.3
    # and the same row's load model prices a schedule under load: a verifier step that grows with its requests
    load = econ["load_model"]
    assert load["verifier_fixed_ms"] > 0
    assert load["verifier_token_ms"] > 0
    assert load["verifier_request_ms"] > 0


def test_the_audit_prices_the_draft_with_the_device_class_prior(tmp_path: Path, verifier_file: Path) -> None:
    config, tensors = eagle3()
    write_checkpoint(tmp_path / "ck", config, tensors)
    figures, loads = {}, {}
    for device in ("NVIDIA-A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "cpu"):
        out = cli("audit", str(tmp_path / "ck"), "--verifier-config", str(verifier_file), "--device-class", device)
        assert out.returncode == 0, out.stderr
        line = next(x for x in out.stdout.splitlines() if x.startswith("economics"))
        figures[device] = line
        loads[device] = next(x for x in out.stdout.splitlines() if x.startswith("under load"))
    assert "(prior a100;" in figures["NVIDIA-A100-SXM4-80GB"]
    assert "(prior h100;" in figures["NVIDIA H100 80GB HBM3"]
    # a GPU's schedule is priced by its row's load model, a CPU's by the saturation model
    assert loads["NVIDIA H100 80GB HBM3"].startswith("under load  h100 load model:")
    assert loads["NVIDIA-A100-SXM4-80GB"].startswith("under load  a100 load model:")
    assert "saturation model" in loads["cpu"]
    # on a CPU the prior is the parameter ratio itself
    cpu = figures["cpu"]
    assert "(prior cpu;" in cpu
    c, ratio = cpu.split("c=")[1].split(" ")[0], cpu.split("parameter ratio ")[1].split(")")[0]
    assert c == ratio


def test_errors_exit_1_and_name_the_rule(tmp_path: Path, verifier_file: Path) -> None:
    config, tensors = dflash(block_size=8)
    config = mutate(config, "speculators_config.proposal_methods.0.speculative_tokens", 8)
    write_checkpoint(tmp_path / "ck", config, tensors)
    out = cli("audit", str(tmp_path / "ck"), "--verifier-config", str(verifier_file))
    assert out.returncode == 1
    assert "ERROR    speculative-tokens" in out.stdout
    assert "speculative_tokens is 8 with block_size 8" in out.stdout
    assert "result      FAILED: 1 error(s)" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such directory"),
        (["audit", "s4://bucket/x"], "unsupported scheme"),
        (["audit", "{ck}", "--release", "nope"], "unknown release 'nope'; supported:"),
        (["audit", "{ck}", "--vllm", "0.34.0"], "not a combination this project has qualified"),
        (["audit", "{ck}", "--verifier-config", "/nonexistent.json"], "No such file"),
        (["audit", "{ck}", "--format", "yaml"], "invalid choice: 'yaml'"),
        (["audit"], "the following arguments are required: SOURCE"),
        (["audit", "{ck}", "--release", "x", "--vllm", "0.32.0"], "not allowed with argument"),
        (["audit", "{bad}"], "header length"),
    ],
)
def test_unreadable_input_and_bad_usage_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    write_checkpoint(tmp_path / "ck", *eagle3())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes(b"\xff" * 16)
    out = cli(*[a.format(ck=tmp_path / "ck", bad=bad) for a in args])
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert message in lines[0]
    assert "Traceback" not in out.stderr


def test_console_script_is_installed() -> None:
    out = subprocess.run(["speculator-operator", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("speculator-operator ")
