"""The header reader against real safetensors files and against broken or hostile ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from speculator_operator.adapters.checkpoints import load_checkpoint
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.checkpoint.safetensors_header import MAX_HEADER_BYTES

from ..ckptgen import eagle3, write_checkpoint


def test_reads_a_file_written_by_the_safetensors_library(tmp_path: Path) -> None:
    save_file(
        {"fc.weight": np.zeros((4, 12), dtype=np.float16), "t2d": np.ones(10, dtype=bool),
         "d2t": np.arange(3, dtype=np.int64)},
        str(tmp_path / "model.safetensors"),
    )  # fmt: skip
    (tmp_path / "config.json").write_text("{}")
    ck = load_checkpoint(str(tmp_path))
    assert {n: (t.dtype, t.shape) for n, t in ck.tensors.items()} == {
        "fc.weight": ("F16", (4, 12)), "t2d": ("BOOL", (10,)), "d2t": ("I64", (3,))}  # fmt: skip
    # the recorded data offsets point at the real bytes
    d2t = ck.tensors["d2t"]
    raw = (tmp_path / "model.safetensors").read_bytes()[d2t.start : d2t.start + d2t.nbytes]
    assert list(np.frombuffer(raw, dtype=np.int64)) == [0, 1, 2]


def test_sparse_qwen3_8b_eagle3_is_read_header_only(tmp_path: Path) -> None:
    config, tensors = eagle3()
    write_checkpoint(tmp_path, config, tensors)
    ck = load_checkpoint(str(tmp_path))
    assert ck.tensors["fc.weight"].shape == (4096, 12288)
    assert ck.tensors["lm_head.weight"].shape == (32000, 4096)
    assert ck.tensors["embed_tokens.weight"].shape == (151936, 4096)
    assert ck.tensors["layers.0.self_attn.q_proj.weight"].shape == (4096, 8192)
    size = (tmp_path / "model.safetensors").stat().st_size
    with (tmp_path / "model.safetensors").open("rb") as fh:
        header = 8 + struct.unpack("<Q", fh.read(8))[0]
    config_bytes = (tmp_path / "config.json").stat().st_size
    assert size > 1_500_000_000
    assert ck.bytes_read == header + config_bytes


def _file(tmp_path: Path, data: bytes) -> str:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(data)
    return str(tmp_path)


def _header(table: object, pad_data: int = 0) -> bytes:
    raw = json.dumps(table).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * pad_data


BAD = {
    "too short": (b"\x01\x02", "too short"),
    "truncated header": (struct.pack("<Q", 500) + b'{"a":', "larger than the file"),
    "absurd length": (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "absurd"),
    "huge length": (struct.pack("<Q", 2**63) + b"{}", "absurd"),
    "not json": (struct.pack("<Q", 4) + b"\xff\xfe{[", "not valid JSON"),
    "json array": (_header([1, 2]), "not an object"),
    "unknown dtype": (_header({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, 1), "unknown dtype"),
    "negative shape": (_header({"w": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 0]}}), "negative"),
    "bool shape": (_header({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, 4), "list of integers"),
    "overflowing shape": (
        _header({"w": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 16]}}, 16), "needs"),
    "offsets past data": (_header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8), "past the end"),
    "offsets reversed": (_header({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, 8), "out of order"),
    "entry not object": (_header({"w": [1, 2]}), "not an object"),
    "bad metadata": (_header({"__metadata__": {"a": 1}}), "__metadata__"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_broken_headers_are_refused_with_a_reason(tmp_path: Path, case: str) -> None:
    data, expected = BAD[case]
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(_file(tmp_path, data))
    assert expected in str(err.value)
    assert "model.safetensors" in str(err.value)


def test_missing_pieces_are_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such directory"):
        load_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match=r"config\.json: no such file"):
        load_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("[1]")
    (tmp_path / "model.safetensors").write_bytes(_header({}))
    with pytest.raises(CheckpointError, match="not an object"):
        load_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"neither model\.safetensors nor"):
        load_checkpoint(str(tmp_path))


def test_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    config, tensors = eagle3(layers=2)
    write_checkpoint(tmp_path, config, tensors, shards=3)
    ck = load_checkpoint(str(tmp_path))
    assert len(ck.files) == 3
    assert set(ck.tensors) == set(tensors)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost.weight"] = ck.files[0]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="no shard holds"):
        load_checkpoint(str(tmp_path))
    index["weight_map"] = {"a": "../../etc/passwd"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="leaves the checkpoint"):
        load_checkpoint(str(tmp_path))
