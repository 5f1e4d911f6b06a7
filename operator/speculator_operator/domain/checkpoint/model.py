"""A speculators checkpoint as the audit sees it: config.json plus the safetensors headers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from speculator_operator.domain.algorithms import MTP_COUNT_KEY, Algorithm, Family, family_of
from speculator_operator.domain.checkpoint.manifest import INDEX as INDEX_FILE
from speculator_operator.domain.checkpoint.manifest import PROVENANCE, Manifest
from speculator_operator.domain.checkpoint.manifest import SINGLE as SINGLE_FILE
from speculator_operator.domain.checkpoint.safetensors_header import HeaderError, TensorInfo, json_object, parse_header
from speculator_operator.domain.checkpoint.sources import Source, SourceError, read_header

LAYER_RE = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


class CheckpointError(ValueError):
    """The checkpoint cannot be read at all (as opposed to read and found wrong)."""


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    return json_object(data, f"{where}:", CheckpointError)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Checkpoint:
    uri: str
    revision: str | None
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    files: list[str]
    source: Source = field(repr=False)
    file_sizes: dict[str, int] = field(default_factory=dict)
    manifest: Manifest | None = None  # every file that makes it up (with sha256s from the provenance record)
    provenance: dict[str, Any] | None = None  # speculators-provenance.json, when the checkpoint has one
    provenance_error: str | None = None  # why it could not be used, when it is there but unreadable
    resolved_from: str | None = None  # the `speculators-latest.json` pointer `uri` was reached through

    # -------------------------------------------------- what config.json says (None when absent/wrong type)

    @property
    def algorithm(self) -> str | None:
        value = self.config.get("speculators_model_type")
        return value if isinstance(value, str) else None

    @property
    def stitched_mtp(self) -> bool:
        """A model with its own MTP layers (`mtp.*`), not a speculators checkpoint: a verifier that
        `speculators stitch-mtp` wrote fine-tuned MTP weights into, served as the target with method mtp."""
        return "speculators_model_type" not in self.config and any(n.startswith("mtp.") for n in self.tensors)

    @property
    def drafting_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of the tensors that draft (a stitched model holds the verifier too: its MTP layers')."""
        return {n: t.shape for n, t in self.tensors.items() if not self.stitched_mtp or n.startswith("mtp.")}

    @property
    def model_type(self) -> str | None:
        value = self.config.get("model_type")
        return value if isinstance(value, str) else None

    @property
    def mtp_layers(self) -> int | None:
        """A stitched model's n_predict (None: a family vLLM does not serve with mtp, or no count)."""
        key = MTP_COUNT_KEY.get(self.model_type or "")
        if key is None:
            return None
        nested = self.config.get("text_config")
        return _int(self.config[key]) if key in self.config or not isinstance(nested, dict) else _int(nested.get(key))

    @property
    def family(self) -> Family | None:
        return family_of(self.algorithm)

    @property
    def speculators_version(self) -> str | None:
        value = self.config.get("speculators_version")
        return value if isinstance(value, str) else None

    @property
    def layer_config(self) -> dict[str, Any]:
        value = self.config.get("transformer_layer_config")
        return value if isinstance(value, dict) else {}

    @property
    def speculators_config(self) -> dict[str, Any]:
        value = self.config.get("speculators_config")
        return value if isinstance(value, dict) else {}

    @property
    def proposal(self) -> dict[str, Any]:
        methods = self.speculators_config.get("proposal_methods")
        if isinstance(methods, list) and methods and isinstance(methods[0], dict):
            return methods[0]
        return {}

    @property
    def recorded_verifier(self) -> dict[str, Any]:
        value = self.speculators_config.get("verifier")
        return value if isinstance(value, dict) else {}

    @property
    def hidden_size(self) -> int | None:
        return _int(self.layer_config.get("hidden_size"))

    @property
    def verifier_vocab_size(self) -> int | None:
        return _int(self.layer_config.get("vocab_size"))

    @property
    def draft_vocab_size(self) -> int | None:
        if self.algorithm == Algorithm.MTP:
            return self.verifier_vocab_size
        return _int(self.config.get("draft_vocab_size"))

    @property
    def aux_ids_key(self) -> str:
        return "eagle_aux_hidden_state_layer_ids" if self.family == Family.EAGLE else "aux_hidden_state_layer_ids"

    @property
    def aux_layer_ids(self) -> list[int] | None:
        value = self.config.get(self.aux_ids_key)
        if isinstance(value, list) and all(_int(v) is not None for v in value):
            return list(value)
        return None

    @property
    def speculative_tokens(self) -> int | None:
        return _int(self.proposal.get("speculative_tokens"))

    @property
    def num_layers(self) -> int | None:
        return _int(self.layer_config.get("num_hidden_layers"))

    def layer_indices(self) -> set[int]:
        found = set()
        for name in self.tensors:
            match = LAYER_RE.match(name)
            if match:
                found.add(int(match[1]))
        return found

    def tensor(self, *names: str) -> TensorInfo | None:
        for name in names:
            if name in self.tensors:
                return self.tensors[name]
        return None

    @property
    def bytes_read(self) -> int:
        return self.source.stats.bytes_read

    def summary(self) -> dict[str, Any]:
        stitched = {"model_type": self.model_type, "mtp_layers": self.mtp_layers} if self.stitched_mtp else None
        return {
            "stitched_mtp": stitched,
            "uri": self.uri,
            "resolved_from": self.resolved_from,
            "revision": self.revision,
            "algorithm": self.algorithm,
            "speculators_version": self.speculators_version,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "draft_vocab_size": self.draft_vocab_size,
            "verifier_vocab_size": self.verifier_vocab_size,
            "aux_layer_ids": self.aux_layer_ids,
            "speculative_tokens": self.speculative_tokens,
            "recorded_verifier": self.recorded_verifier.get("name_or_path"),
            "files": self.files,
            "provenance": None
            if self.provenance is None
            else {k: self.provenance.get(k) for k in ("job", "verifier", "verifierRevision", "digest", "published")},
            "tensors": len(self.tensors),
            "parameters": sum(t.numel for t in self.tensors.values()),
            "bytes_on_disk": sum(self.file_sizes.values()),
            "bytes_read": self.source.stats.bytes_read,
            "requests": self.source.stats.requests,
        }


def read_checkpoint(source: Source) -> Checkpoint:
    """Read config.json and every safetensors header through `source`, header only (the source's kind chose the
    files that make it up: a stitched MTP model is served as the target, its tokenizer counts as a verifier's
    does). Opening a location is the shell's: adapters/checkpoints.py."""
    try:
        config = _json_object(source.read_small("config.json"), f"{source.uri}/config.json")
        if source.exists(INDEX_FILE):
            index = _json_object(source.read_small(INDEX_FILE), f"{source.uri}/{INDEX_FILE}")
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(f"{source.uri}/{INDEX_FILE}: weight_map must map tensor names to file names")
            files = sorted(set(weight_map.values()))
        elif source.exists(SINGLE_FILE):
            files, weight_map = [SINGLE_FILE], None
        else:
            raise CheckpointError(f"{source.uri}: neither {SINGLE_FILE} nor {INDEX_FILE} is there")
        tensors: dict[str, TensorInfo] = {}
        sizes: dict[str, int] = {}
        for name in files:
            if "/" in name.strip("./") or name.startswith(("/", "..")):
                raise CheckpointError(f"{source.uri}/{INDEX_FILE}: shard name {name!r} leaves the checkpoint")
            raw, size = read_header(source, name)
            found, _ = parse_header(raw, name, size, label=f"{source.uri}/{name}")
            sizes[name] = size
            for tname, info in found.items():
                if tname in tensors:
                    raise CheckpointError(f"{source.uri}: tensor {tname!r} is in both {tensors[tname].file} and {name}")
                tensors[tname] = info
        if weight_map is not None:
            missing = sorted(set(weight_map) - set(tensors))
            if missing:
                raise CheckpointError(
                    f"{source.uri}/{INDEX_FILE}: lists {len(missing)} tensor(s) no shard holds, e.g. {missing[0]!r}"
                )
        provenance, problem = _provenance(source)
        manifest = source.manifest
        if manifest is not None and provenance is not None and isinstance(provenance.get("files"), dict):
            manifest = manifest.with_sha256(
                {k: v.get("sha256") for k, v in provenance["files"].items() if isinstance(v, dict)}
            )
        revision = source.revision
    except HeaderError as exc:
        raise CheckpointError(str(exc)) from None
    except SourceError as exc:
        raise CheckpointError(str(exc)) from None
    return Checkpoint(
        uri=source.uri,
        revision=revision,
        config=config,
        tensors=tensors,
        files=files,
        source=source,
        file_sizes=sizes,
        manifest=manifest,
        provenance=provenance,
        provenance_error=problem,
        resolved_from=source.resolved_from,
    )


def _provenance(source: Source) -> tuple[dict[str, Any] | None, str | None]:
    """The publish record beside the checkpoint, or why it cannot be used (it is then ignored)."""
    if not source.exists(PROVENANCE):
        return None, None
    try:
        return _json_object(source.read_small(PROVENANCE), f"{source.uri}/{PROVENANCE}"), None
    except CheckpointError as exc:
        return None, str(exc)


@dataclass(frozen=True)
class VerifierRef:
    """A verifier as the operator sees it: its config.json and what names its bytes."""

    config: dict[str, Any]
    revision: str | None  # the hub commit sha, or the s3 listing digest
    content: str | None = None  # the identity of the files vLLM reads (see Source.content)
    manifest: Manifest | None = None  # the files a pod stages (s3://)


def read_verifier_ref(source: Source) -> VerifierRef:
    """A verifier's config.json through `source`, with its revision and the files that make it up (config, weights,
    tokenizer: checkpoint/manifest.py)."""
    try:
        config = _json_object(source.read_small("config.json"), f"{source.uri}/config.json")
        return VerifierRef(config, source.revision, source.content, source.manifest)
    except SourceError as exc:
        raise CheckpointError(str(exc)) from None


def config_file(data: bytes, where: str) -> dict[str, Any]:
    """A config.json read whole (a JSON object, or CheckpointError saying where it is not one)."""
    return _json_object(data, where)
