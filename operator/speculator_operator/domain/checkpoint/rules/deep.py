"""The --deep rules: they read tensor data by ranged reads (sampled lm_head/embed_tokens/fc for NaN or
all-zero weights, the vocabulary maps whole), where every other rule reads headers only (`needs="deep"`).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator

from speculator_operator.domain.checkpoint.rules.base import AuditContext, Severity, rule
from speculator_operator.domain.checkpoint.safetensors_header import TensorInfo

SAMPLE_BYTES = 64 * 1024


def _bf16_or_f16_nan(data: bytes, dtype: str) -> tuple[int, int]:
    """(NaN count, non-zero count) of a little-endian BF16/F16/F32 buffer."""
    if dtype == "F32":
        values = struct.unpack(f"<{len(data) // 4}I", data[: len(data) // 4 * 4])
        exp, mant = 0x7F800000, 0x007FFFFF
    else:
        values = struct.unpack(f"<{len(data) // 2}H", data[: len(data) // 2 * 2])
        exp, mant = (0x7F80, 0x007F) if dtype == "BF16" else (0x7C00, 0x03FF)
    nans = sum(1 for x in values if x & exp == exp and x & mant)
    nonzero = sum(1 for x in values if x & (exp | mant))  # anything but +0 / -0
    return nans, nonzero


def _samples(ctx: AuditContext, t: TensorInfo) -> bytes:
    """The whole tensor if small, else three slices of it (start, middle, end), by ranged reads."""
    read = ctx.checkpoint.source.read_range
    if t.nbytes <= 3 * SAMPLE_BYTES:
        return read(t.file, t.start, t.nbytes)[0]
    out = b""
    for frac in (0.0, 0.5, 1.0):
        start = t.start + int((t.nbytes - SAMPLE_BYTES) * frac) // 4 * 4  # element-aligned (2- and 4-byte types)
        out += read(t.file, start, SAMPLE_BYTES)[0]
    return out


@rule("deep-loaded", Severity.ERROR, "lm_head/embed_tokens hold real weights (not NaN, not all zero)", needs="deep")
def deep_loaded(ctx: AuditContext) -> Iterator[str]:
    for name in ("lm_head.weight", "embed_tokens.weight", "fc.weight"):
        t = ctx.checkpoint.tensor(name)
        if t is None or t.dtype not in ("BF16", "F16", "F32") or t.nbytes == 0:
            continue
        nans, nonzero = _bf16_or_f16_nan(_samples(ctx, t), t.dtype)
        if nans:
            yield f"{name}: {nans} NaN values in the sampled rows: the weights were never loaded or diverged"
        elif nonzero == 0:
            yield f"{name}: the sampled rows are all zero: the weights were never loaded"


@rule("deep-vocab-map", Severity.ERROR, "t2d marks exactly draft_vocab_size tokens; d2t is increasing", needs="deep")
def deep_vocab_map(ctx: AuditContext) -> Iterator[str]:
    ck = ctx.checkpoint
    t2d, d2t, vd = ck.tensor("t2d"), ck.tensor("d2t"), ck.draft_vocab_size
    if t2d is not None and t2d.dtype == "BOOL" and vd is not None and t2d.nbytes <= 64 * 1024 * 1024:
        data, _ = ck.source.read_range(t2d.file, t2d.start, t2d.nbytes)
        marked = sum(1 for b in data if b)
        if marked != vd:
            yield f"t2d marks {marked} tokens, draft_vocab_size is {vd}"
    if d2t is not None and d2t.dtype == "I64" and d2t.nbytes <= 64 * 1024 * 1024:
        data, _ = ck.source.read_range(d2t.file, d2t.start, d2t.nbytes)
        offsets = struct.unpack(f"<{len(data) // 8}q", data[: len(data) // 8 * 8])
        targets = [i + o for i, o in enumerate(offsets)]
        if any(o < 0 for o in offsets) or any(b <= a for a, b in itertools.pairwise(targets)):
            yield "d2t offsets do not map draft ids to strictly increasing verifier ids"
