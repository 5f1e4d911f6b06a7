"""Parse and validate a safetensors header (the 8-byte length + JSON table) without tensor data.

The format: a little-endian u64 N, then N bytes of JSON mapping tensor names to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section that follows
the header), plus an optional "__metadata__" map of strings. Everything here is checked against the
file size, so a truncated or hostile header is refused in bounded time and memory.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

# The safetensors reference implementation refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
# sub-byte types: bits per element
DTYPE_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def json_object(data: bytes, what: str, error: type[Exception]) -> dict[str, Any]:
    """`data` as a JSON object, else `error` naming `what` ("<where>: header is", "<where>:") and the reason."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what} not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise error(f"{what} a JSON {type(value).__name__}, not an object")
    return value


class HeaderError(ValueError):
    """A safetensors header that cannot be trusted; the message names the file and the problem."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    start: int  # absolute offset of the first byte of data in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def header_length(prefix: bytes, file: str, file_size: int | None) -> int:
    if len(prefix) < 8:
        raise HeaderError(f"{file}: {len(prefix)} bytes, too short for a safetensors header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise HeaderError(f"{file}: header length {n} bytes is absurd (limit {MAX_HEADER_BYTES})")
    if n < 2:
        raise HeaderError(f"{file}: header length {n} bytes cannot hold a JSON object")
    if file_size is not None and 8 + n > file_size:
        raise HeaderError(f"{file}: header length {n} bytes is larger than the file ({file_size} bytes): truncated")
    return int(n)


def parse_header(
    raw: bytes, file: str, file_size: int | None, label: str | None = None
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """`raw` is the N header bytes (after the 8-byte length) of `file`; `label` names it in errors.
    Returns (tensors, metadata)."""
    where = label or file
    table = json_object(raw, f"{where}: header is", HeaderError)
    data_start = 8 + len(raw)
    data_size = None if file_size is None else file_size - data_start
    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    for name, entry in table.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise HeaderError(f"{where}: __metadata__ must map strings to strings")
            metadata = dict(entry)
            continue
        tensors[name] = _tensor(name, entry, file, where, data_start, data_size)
    return tensors, metadata


def _tensor(name: str, entry: Any, file: str, label: str, data_start: int, data_size: int | None) -> TensorInfo:
    where = f"{label}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise HeaderError(f"{where}: entry is not an object")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or (dtype not in DTYPE_BYTES and dtype not in DTYPE_BITS):
        raise HeaderError(f"{where}: unknown dtype {dtype!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise HeaderError(f"{where}: shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise HeaderError(f"{where}: negative dimension in shape {shape}")
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise HeaderError(f"{where}: data_offsets must be [begin, end], got {offsets!r}")
    begin, end = offsets
    if begin < 0 or end < begin:
        raise HeaderError(f"{where}: data_offsets {offsets} are out of order")
    numel = math.prod(shape)
    nbytes = numel * DTYPE_BYTES[dtype] if dtype in DTYPE_BYTES else (numel * DTYPE_BITS[dtype] + 7) // 8
    if end - begin != nbytes:
        raise HeaderError(
            f"{where}: shape {shape} of {dtype} needs {nbytes} bytes but data_offsets {offsets} span {end - begin}"
        )
    if data_size is not None and end > data_size:
        raise HeaderError(f"{where}: data_offsets end {end} is past the end of the data ({data_size} bytes)")
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), file=file, start=data_start + begin, nbytes=nbytes)
