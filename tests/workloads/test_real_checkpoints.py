"""Checkpoints written by the real speculators 0.9.0 pass the audit; mutated copies fail with the right rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import run_in

pytestmark = pytest.mark.workloads


def audit_cli(ckpt: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "speculator_operator.cli", "audit", str(ckpt), "--format", "json", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize("algo", ["eagle3", "peagle", "dflash", "dflash2", "dspark", "eagle3-pruned"])
def test_real_dry_run_checkpoint_passes(dry_run_checkpoints: dict[str, Path], algo: str) -> None:
    ckpt, verifier = dry_run_checkpoints[algo], dry_run_checkpoints["verifier"]
    rc, report = audit_cli(ckpt, "--verifier", str(verifier), "--deep")
    assert rc == 0, report["findings"]
    assert [f for f in report["findings"] if f["severity"] != "info"] == []
    ck = report["checkpoint"]
    assert ck["algorithm"] == algo.split("-")[0]
    assert ck["speculators_version"] == "0.9.0"
    assert ck["hidden_size"] == 128
    assert ck["verifier_vocab_size"] == 512
    assert ck["aux_layer_ids"] == [2, 4, 5]  # (2, L//2, L-3) for the 8-layer verifier
    assert ck["draft_vocab_size"] == (256 if algo == "eagle3-pruned" else 512)
    assert (
        ck["speculative_tokens"]
        == {"eagle3": 3, "peagle": 8, "dflash": 15, "dflash2": 7, "dspark": 8}[algo.split("-")[0]]
    )
    if algo == "dflash2":  # speculators' default: non-causal sliding windows, served as such by vLLM 0.32.0's V2
        rules = {f["rule"] for f in report["findings"]}
        assert "vllm-runner" in rules


def _edit_config(path: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((path / "config.json").read_text())
    fn(config)
    (path / "config.json").write_text(json.dumps(config))


def _k(value: int) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = value

    return edit


def _causal_with_a_full_layer(config: dict[str, Any]) -> None:
    config["sliding_window_non_causal"] = False
    config["transformer_layer_config"]["layer_types"][0] = "full_attention"


CONFIG_MUTATIONS: dict[str, tuple[str, Callable[[dict[str, Any]], None], str]] = {
    "dflash K = block_size": ("dflash", _k(16), "speculative-tokens"),
    "dspark K = block_size - 1": ("dspark", _k(7), "speculative-tokens"),
    "eagle3 unknown decoder": ("eagle3", lambda c: c["transformer_layer_config"].update(model_type="mistral"),
                               "decoder-family"),
    "eagle3 norm_before_residual dropped": ("eagle3", lambda c: c.pop("norm_before_residual"), "vllm-defaults"),
    "dflash sliding_window_non_causal dropped": ("dflash", lambda c: c.pop("sliding_window_non_causal"),
                                                 "vllm-defaults"),
    "dflash aux ids dropped": ("dflash", lambda c: c.pop("aux_hidden_state_layer_ids"), "aux-layer-ids"),
    "peagle mask token dropped": ("peagle", lambda c: c.update(mask_token_id=None), "mask-token"),
    "eagle3 aux id past the verifier": ("eagle3", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, 9]),
                                        "verifier-layers"),
    "eagle3 lossy": ("eagle3", lambda c: c["speculators_config"]["proposal_methods"][0].update(verifier_accept_k=2),
                     "lossless"),
    "dspark as mtp": ("dspark", lambda c: c.update(speculators_model_type="mtp"), "vllm-loadable"),
    # causal windows beside a full-attention layer: vLLM would run that layer causal, speculators trained it not
    "dflash2 causal with a full layer": ("dflash2", lambda c: _causal_with_a_full_layer(c), "vllm-servable"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CONFIG_MUTATIONS))
def test_mutated_real_checkpoint_fails_with_the_right_rule(
    dry_run_checkpoints: dict[str, Path], tmp_path: Path, case: str
) -> None:
    algo, edit, rule = CONFIG_MUTATIONS[case]
    copy = tmp_path / algo
    shutil.copytree(dry_run_checkpoints[algo], copy)
    _edit_config(copy, edit)
    rc, report = audit_cli(copy, "--verifier", str(dry_run_checkpoints["verifier"]))
    assert rc == 1
    assert rule in {f["rule"] for f in report["findings"] if f["severity"] == "error"}, report["findings"]


def test_verifier_with_another_hidden_size_is_refused(dry_run_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    verifier = json.loads((dry_run_checkpoints["verifier"] / "config.json").read_text())
    verifier["hidden_size"] = 256
    (tmp_path / "v.json").write_text(json.dumps(verifier))
    rc, report = audit_cli(dry_run_checkpoints["dflash"], "--verifier-config", str(tmp_path / "v.json"))
    assert rc == 1
    assert any(f["rule"] == "verifier-hidden-size" and "128 != verifier hidden_size 256" in f["message"]
               for f in report["findings"])  # fmt: skip


@pytest.mark.parametrize(
    ("algo", "drop", "rule"),
    [("eagle3", "lm_head.weight", "lm-head"), ("eagle3-pruned", "t2d", "vocab-maps"),
     ("dflash", "layers.0.self_attn.q_proj.weight", "layer0-attention"), ("eagle3", "fc.weight", "fc-shape")],
)  # fmt: skip
def test_real_checkpoint_missing_a_tensor_fails(
    dry_run_checkpoints: dict[str, Path], workloads_env: Path, tmp_path: Path, algo: str, drop: str, rule: str
) -> None:
    copy = tmp_path / algo
    shutil.copytree(dry_run_checkpoints[algo], copy)
    # rewrite the weights with the real safetensors library, without one tensor
    run_in(workloads_env, "python", "-c", (
        "import sys; from safetensors.torch import load_file, save_file; p = sys.argv[1]; t = load_file(p); "
        "t.pop(sys.argv[2]); save_file(t, p, metadata={'format': 'pt'})"
    ), str(copy / "model.safetensors"), drop)  # fmt: skip
    rc, report = audit_cli(copy, "--verifier", str(dry_run_checkpoints["verifier"]))
    assert rc == 1
    assert rule in {f["rule"] for f in report["findings"] if f["severity"] == "error"}, report["findings"]
