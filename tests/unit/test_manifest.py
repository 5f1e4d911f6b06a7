"""What names a checkpoint's bytes: the files that count, the digest over them, and the list a pod stages."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from speculator_operator.adapters.checkpoints import load_checkpoint
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.checkpoint.manifest import LATEST, FileEntry, Manifest, hub_content, s3_revision, select

DRAFT = {
    "config.json": ("c0ffee", 900),
    "model.safetensors": ("5afe", 123_456),
    "speculators-provenance.json": ("9e0", 700),
}
# what a published or mirrored repository holds besides: none of it is read by vLLM
NOT_READ = {
    "README.md": ("r", 10),
    ".gitattributes": ("g", 5),
    "LICENSE": ("l", 50),
    "training_state.json": ("t", 20),
    "train_command.txt": ("tc", 30),
    "val_metrics.json": ("v", 40),
    "optimizer_state_dict.pt": ("o", 4000),
    "speculators-latest.json": ("p", 80),
    "original/consolidated.00.pth": ("x", 9000),
    "tokenizer.json": ("tok", 7000),  # a draft drafts with the verifier's tokenizer
}


def revision(listing: dict[str, tuple[str, int]], kind: str = "draft") -> str:
    return s3_revision(Manifest.from_listing(listing, kind))  # type: ignore[arg-type]


def test_the_digest_does_not_depend_on_the_listing_order() -> None:
    items = list(DRAFT.items())
    for seed in range(5):
        random.Random(seed).shuffle(items)
        assert revision(dict(items)) == revision(DRAFT)


@pytest.mark.parametrize(
    "change",
    [
        {"model.safetensors": ("5afe-2", 123_456)},  # weights replaced, same size
        {"model.safetensors": ("5afe", 123_457)},  # same identity, another size
        {"config.json": ("c0ffef", 900)},
        {"speculators-provenance.json": ("9e1", 700)},  # another publish record
        {"model-00002-of-00002.safetensors": ("s2", 10)},  # a shard added
        {"generation_config.json": ("gc", 10)},
    ],
)
def test_the_digest_moves_with_any_file_that_makes_up_the_draft(change: dict[str, tuple[str, int]]) -> None:
    assert revision({**DRAFT, **change}) != revision(DRAFT)


def test_a_removed_file_moves_the_digest() -> None:
    assert revision({k: v for k, v in DRAFT.items() if k != "speculators-provenance.json"}) != revision(DRAFT)


def test_files_vllm_does_not_read_do_not_count() -> None:
    assert revision({**DRAFT, **NOT_READ}) == revision(DRAFT)
    assert select({**DRAFT, **NOT_READ}, "draft") == sorted(DRAFT)


def test_a_verifier_counts_its_tokenizer_generation_config_and_code() -> None:
    verifier = {
        "config.json": ("c", 1),
        "generation_config.json": ("g", 1),
        "model.safetensors.index.json": ("i", 1),
        "model-00001-of-00002.safetensors": ("a", 1),
        "model-00002-of-00002.safetensors": ("b", 1),
        "tokenizer.json": ("t", 1),
        "tokenizer_config.json": ("tc", 1),
        "chat_template.jinja": ("ct", 1),
        "modeling_custom.py": ("py", 1),
    }
    assert select({**verifier, **{k: v for k, v in NOT_READ.items() if k != "tokenizer.json"}}, "verifier") == sorted(
        verifier
    )
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json", "modeling_custom.py"):
        assert revision({**verifier, name: ("changed", 2)}, "verifier") != revision(verifier, "verifier")
    # weights in another format do not count beside safetensors ...
    assert revision({**verifier, "pytorch_model.bin": ("bin", 9)}, "verifier") == revision(verifier, "verifier")
    # ... but are the weights when there are no safetensors (vLLM's fallback)
    bin_only = {"config.json": ("c", 1), "pytorch_model.bin": ("bin", 9), "tokenizer.json": ("t", 1)}
    assert "pytorch_model.bin" in select(bin_only, "verifier")


def test_the_staged_list_survives_the_pod_template_and_refuses_bad_input() -> None:
    manifest = Manifest.from_listing(DRAFT, "draft").with_sha256({"model.safetensors": "ab" * 32, "x": "nothex"})
    again = Manifest.from_arg(manifest.to_arg())
    assert again == manifest
    assert again.get("model.safetensors") == FileEntry("model.safetensors", "5afe", 123_456, "ab" * 32)
    assert again.digest() == Manifest.from_listing(DRAFT, "draft").digest()  # sha256s are not in the digest
    for bad, words in [
        ("not json", "not JSON"),
        ("[]", "non-empty"),
        ('[["../config.json", "e", 1]]', "bad file name"),
        ('[["a/b", "e", 1]]', "bad file name"),
        ('[["x", "e", -1]]', "bad identity or size"),
        ('[["x", "e", true]]', "bad identity or size"),
        ('[["x", "e", 1, "zz"]]', "bad sha256"),
        ('[["x", "e", 1], ["x", "f", 2]]', "listed twice"),
    ]:
        with pytest.raises(ValueError, match=words):
            Manifest.from_arg(bad)


def test_hub_content_ignores_what_a_readme_commit_changes() -> None:
    files = {"config.json": ("blob1", 10), "model.safetensors": ("lfs-sha", 100)}
    with_readme = {**files, "README.md": ("blob-readme-2", 30)}
    assert hub_content(Manifest.from_listing(files, "verifier")) == hub_content(
        Manifest.from_listing(with_readme, "verifier")
    )


def test_a_pointer_leads_only_to_a_folder_beside_it(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    for name in ("../elsewhere", "a/b", "", None):
        (tmp_path / "out" / LATEST).write_text(json.dumps({"name": name}))
        with pytest.raises(CheckpointError, match="not a pointer to a folder beside it"):
            load_checkpoint(str(tmp_path / "out"))
    (tmp_path / "out" / LATEST).write_text("not json")
    with pytest.raises(CheckpointError, match="not a pointer"):
        load_checkpoint(str(tmp_path / "out"))
