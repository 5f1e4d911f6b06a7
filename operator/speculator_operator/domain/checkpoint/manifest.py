"""What a checkpoint is made of: the files vLLM (and the audit) read, each named by its store's identity.

A checkpoint's revision must name its bytes, not a folder: a digest over every file that makes it up
(name, the store's identity of that object — an S3 ETag, a hub blob id — and size), obtained from a
listing, never from a download. The same list travels into the pod template, and the `stage` init
container fetches exactly those objects and refuses any other (docs/reference/speculators.md §2;
docs/reference/vllm.md §3.1 for what vLLM reads).

Which files count (top-level names only; vLLM reads nothing from sub-folders):
- a draft: config.json, generation_config.json, model.safetensors.index.json, every *.safetensors, and
  speculators-provenance.json (the publish record the audit reads: which verifier revision it was
  trained for, every file's sha256);
- a verifier: the same, plus the tokenizer, chat-template, processor and remote-code files vLLM reads
  (TOKENIZER_FILES, *.tiktoken, *.py); its weights are the *.safetensors files, or — only when there are
  none — the *.bin (then *.pt) files vLLM falls back to, with pytorch_model.bin.index.json.
Everything else is ignored and never staged: README/LICENSE/.gitattributes and other documents, images,
sub-folders (original/, onnx/, publish staging), the `speculators-latest.json` pointer (it names a
location, not content), training leftovers (training_state.json, train_command.txt, val_metrics.json,
run.yaml, optimizer and scheduler state), weights in formats vLLM does not load when safetensors exist,
and a draft's tokenizer (vLLM drafts with the verifier's tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

Kind = Literal["draft", "verifier"]

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PROVENANCE = "speculators-provenance.json"
LATEST = "speculators-latest.json"

COMMON_FILES = frozenset({CONFIG, "generation_config.json", INDEX, PROVENANCE})
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
    "pytorch_model.bin.index.json",
})  # fmt: skip
VERIFIER_SUFFIXES = (".tiktoken", ".py")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# files vLLM reads that do not change what the model computes for a token sequence: sampling defaults, the
# chat template, the publish record. A change of these moves the revision (the pods must stage the new
# bytes) but not the content identity that a draft's provenance is checked against.
NOT_MODEL = frozenset({"generation_config.json", "chat_template.jinja", "chat_template.json", PROVENANCE})


@dataclass(frozen=True)
class FileEntry:
    """One object of a checkpoint: its name in the folder, the store's identity of its bytes (an S3 ETag
    without quotes, a hub blob id; "" where the store has none), its size, and its sha256 where the
    publish record gives one."""

    name: str
    etag: str
    size: int
    sha256: str | None = None

    def as_list(self) -> list[Any]:
        return [self.name, self.etag, self.size, *([self.sha256] if self.sha256 else [])]


def select(names: Iterable[str], kind: Kind) -> list[str]:
    """The names among `names` that make up a checkpoint of this kind (see the module docstring)."""
    top = sorted({n for n in names if n and "/" not in n})
    if kind == "draft":
        return [n for n in top if n in COMMON_FILES or n.endswith(".safetensors")]
    wanted = [n for n in top if n in COMMON_FILES or n in TOKENIZER_FILES or n.endswith(VERIFIER_SUFFIXES)]
    weights = [n for n in top if n.endswith(".safetensors")]
    if not weights:  # vLLM's own fallback order when a model ships no safetensors
        weights = [n for n in top if n.endswith(".bin")] or [n for n in top if n.endswith(".pt")]
    return sorted({*wanted, *weights})


@dataclass(frozen=True)
class Manifest:
    """The files of one checkpoint revision, sorted by name."""

    files: tuple[FileEntry, ...]

    @classmethod
    def of(cls, entries: Iterable[FileEntry]) -> Manifest:
        by_name: dict[str, FileEntry] = {}
        for entry in entries:
            if entry.name in by_name:
                raise ValueError(f"manifest: {entry.name} is listed twice")
            by_name[entry.name] = entry
        return cls(tuple(by_name[n] for n in sorted(by_name)))

    @classmethod
    def from_listing(cls, listing: Mapping[str, tuple[str, int]], kind: Kind) -> Manifest:
        """The manifest of a store listing {name: (identity, size)}: only the files that count."""
        return cls.of(FileEntry(n, listing[n][0], listing[n][1]) for n in select(listing, kind))

    def digest(self) -> str:
        """sha256 over the sorted (name, identity, size) triples: the same files give the same digest in
        any listing order; any file added, removed, replaced or resized gives another. The sha256s from the
        publish record are not part of it (the record itself is one of the files)."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.name}\0{f.etag}\0{f.size}\n".encode())
        return h.hexdigest()

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    def get(self, name: str) -> FileEntry | None:
        return next((f for f in self.files if f.name == name), None)

    def model_files(self) -> Manifest:
        """The files that decide what the model computes: config, weights, tokenizer, code (NOT_MODEL left
        out)."""
        return Manifest(tuple(f for f in self.files if f.name not in NOT_MODEL))

    def with_sha256(self, hashes: Mapping[str, Any]) -> Manifest:
        """This manifest with the sha256 of each file the publish record names (others unchanged)."""
        out = []
        for f in self.files:
            value = hashes.get(f.name)
            out.append(replace(f, sha256=value) if isinstance(value, str) and SHA256.match(value) else f)
        return Manifest(tuple(out))

    def to_arg(self) -> str:
        """Compact JSON for a pod template argument: [[name, identity, size(, sha256)], ...]."""
        return json.dumps([f.as_list() for f in self.files], separators=(",", ":"))

    @classmethod
    def from_arg(cls, text: str) -> Manifest:
        """Parse `to_arg`'s form; ValueError names what is wrong."""
        try:
            rows = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"manifest: not JSON ({exc})") from None
        if not isinstance(rows, list) or not rows:
            raise ValueError("manifest: expected a non-empty JSON list of [name, etag, size(, sha256)]")
        entries = []
        for row in rows:
            if not isinstance(row, list) or len(row) not in (3, 4):
                raise ValueError(f"manifest: bad entry {row!r}")
            name, etag, size, *rest = row
            if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                raise ValueError(f"manifest: bad file name {name!r}")
            if not isinstance(etag, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"manifest: bad identity or size for {name}")
            sha = rest[0] if rest else None
            if sha is not None and not (isinstance(sha, str) and SHA256.match(sha)):
                raise ValueError(f"manifest: bad sha256 for {name}")
            entries.append(FileEntry(name, etag, size, sha))
        return cls.of(entries)


def s3_revision(manifest: Manifest) -> str:
    """The revision of an s3:// checkpoint: its manifest digest."""
    return "s3:" + manifest.digest()[:24]


def s3_content(manifest: Manifest) -> str:
    """The content identity of an s3:// checkpoint: the digest of its model files (Manifest.model_files)."""
    return "s3c:" + manifest.model_files().digest()[:24]


def hub_content(manifest: Manifest) -> str:
    """The content identity of a hub checkpoint at a commit: the digest of its model files, which a commit
    touching only the README (or the sampling defaults) does not move; the commit sha does."""
    return "hf:" + manifest.model_files().digest()[:24]
