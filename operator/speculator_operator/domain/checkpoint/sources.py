"""What the audit reads a checkpoint through (the port; the stores that implement it, a folder, s3:// and hf://,
are the shell's: adapters/sources.py).

A source reads small files whole (config.json, the shard index) and safetensors files by byte range only, and
counts the bytes and requests it made, so the audit can prove it never downloaded weights. Each also says what
the checkpoint is made of (checkpoint/manifest.py) and what names its bytes (its revision).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

from speculator_operator.domain.checkpoint.manifest import Kind, Manifest
from speculator_operator.domain.checkpoint.safetensors_header import HeaderError, header_length

# config.json and the shard index are small; anything bigger is not what we think it is
MAX_SMALL_FILE = 16 * 1024 * 1024


class SourceError(ValueError):
    """The checkpoint (or verifier) location cannot be read; the message says where and why."""


@dataclass
class ReadStats:
    bytes_read: int = 0
    requests: int = 0
    per_file_requests: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, nbytes: int) -> None:
        self.bytes_read += nbytes
        self.requests += 1
        self.per_file_requests[name] = self.per_file_requests.get(name, 0) + 1


class Source(Protocol):
    uri: str
    stats: ReadStats
    kind: Kind
    resolved_from: str | None  # the pointer (`speculators-latest.json`) the uri was reached through

    @property
    def revision(self) -> str | None:
        """What names this checkpoint's bytes: the hub commit sha, or the digest of an s3:// listing."""
        ...

    @property
    def content(self) -> str | None:
        """The identity of the model files (config, weights, tokenizer: a change of the sampling defaults,
        the chat template or the README does not move it); None where the store gives none (a folder)."""
        ...

    @property
    def manifest(self) -> Manifest | None:
        """The files that make up the checkpoint, each with the store's identity and size."""
        ...

    def exists(self, name: str) -> bool: ...

    def read_small(self, name: str) -> bytes: ...

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        """`length` bytes from `start` (fewer at the end of the file), and the file's total size."""
        ...


def read_header(source: Source, name: str) -> tuple[bytes, int]:
    """The raw JSON header of a safetensors file and the file size: exactly two range reads (the 8-byte
    length, then the header), so not one byte of tensor data is fetched."""
    prefix, size = source.read_range(name, 0, 8)
    n = header_length(prefix, f"{source.uri}/{name}", size)
    raw, _ = source.read_range(name, 8, n)
    if len(raw) != n:
        raise HeaderError(f"{source.uri}/{name}: header truncated ({len(raw)} of {n} bytes)")
    return raw, size


def pointer_target(raw: bytes, where: str) -> str:
    """The folder a `speculators-latest.json` pointer names: one directly under the pointer's own folder."""
    try:
        name = json.loads(raw.decode("utf-8")).get("name")
    except (UnicodeDecodeError, ValueError, AttributeError):
        name = None
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise SourceError(f'{where}: not a pointer to a folder beside it (its "name" is {name!r})')
    return name
