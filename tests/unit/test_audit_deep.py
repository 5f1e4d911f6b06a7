"""--deep: tensor data sampled by ranged reads (never-loaded weights, vocab maps)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from speculator_operator.adapters.checkpoints import audit

from ..ckptgen import eagle3

SMALL = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
    "vocab_size": 512,
}  # fmt: skip
VD = 128


def write_real(folder: Path, *, nan_lm_head: bool = False, t2d_count: int = VD, d2t_bad: bool = False) -> Path:
    config, spec = eagle3(SMALL, draft_vocab=VD)
    rng = np.random.default_rng(0)
    arrays = {}
    for name, (dtype, shape) in spec.items():
        if dtype == "BF16":
            arrays[name] = rng.standard_normal(shape).astype(np.float16)
    if nan_lm_head:
        arrays["lm_head.weight"][3, 5] = np.nan
    t2d = np.zeros(SMALL["vocab_size"], dtype=bool)
    chosen = np.sort(rng.choice(SMALL["vocab_size"], size=VD, replace=False))
    t2d[chosen[:t2d_count]] = True
    d2t = (chosen - np.arange(VD)).astype(np.int64)
    if d2t_bad:
        d2t[10] = -5
    arrays["t2d"], arrays["d2t"] = t2d, d2t
    folder.mkdir()
    save_file(arrays, str(folder / "model.safetensors"))
    config["dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def deep_errors(folder: Path) -> list[str]:
    report = audit(str(folder), verifier=SMALL, deep=True)
    return [f"{f.rule}: {f.message}" for f in report.errors]


def test_real_weights_pass_deep(tmp_path: Path) -> None:
    assert deep_errors(write_real(tmp_path / "ok")) == []


def test_nan_in_lm_head_is_found(tmp_path: Path) -> None:
    errs = deep_errors(write_real(tmp_path / "nan", nan_lm_head=True))
    assert any(e.startswith("deep-loaded: lm_head.weight: 1 NaN") for e in errs), errs


def test_t2d_count_and_d2t_order_are_checked(tmp_path: Path) -> None:
    errs = deep_errors(write_real(tmp_path / "t2d", t2d_count=VD - 3))
    assert f"deep-vocab-map: t2d marks {VD - 3} tokens, draft_vocab_size is {VD}" in errs
    errs = deep_errors(write_real(tmp_path / "d2t", d2t_bad=True))
    assert any("d2t offsets" in e for e in errs)


def test_without_deep_no_tensor_data_is_read(tmp_path: Path) -> None:
    folder = write_real(tmp_path / "nan", nan_lm_head=True)
    report = audit(str(folder), verifier=SMALL)
    assert report.ok
    header = 8 + int.from_bytes((folder / "model.safetensors").read_bytes()[:8], "little")
    assert report.checkpoint.bytes_read == header + (folder / "config.json").stat().st_size
