"""One parse for every location a spec or a pod names (domain/location.py)."""

from __future__ import annotations

import pytest

from speculator_operator.domain.location import Location, Scheme


@pytest.mark.parametrize(
    ("uri", "scheme", "root", "path", "revision"),
    [
        ("s3://bucket/drafts/a/", Scheme.S3, "bucket", "drafts/a/", None),
        ("s3://bucket", Scheme.S3, "bucket", "", None),
        ("hf://org/repo@v1.2", Scheme.HUB, "org/repo", "", "v1.2"),
        ("hf://org/repo", Scheme.HUB, "org/repo", "", None),
        ("pvc://claim/sub/dir", Scheme.PVC, "claim", "sub/dir", None),
        ("pvc://claim", Scheme.PVC, "claim", "", None),
        ("/models/draft", Scheme.PATH, "", "/models/draft", None),
        ("hf:org/dataset:subset", Scheme.PATH, "", "hf:org/dataset:subset", None),  # a data preset, not a hub uri
        ("gs://bucket/x", Scheme.OTHER, "gs", "bucket/x", None),
    ],
)
def test_each_form_parses_to_its_parts(uri: str, scheme: Scheme, root: str, path: str, revision: str | None) -> None:
    where = Location.parse(uri)
    assert (where.scheme, where.root, where.path, where.revision) == (scheme, root, path, revision)
    assert where.uri == uri


def test_a_bare_id_is_a_hub_repo_where_one_is_meant() -> None:
    assert Location.parse("Qwen/Qwen3-8B").is_path
    hub = Location.parse("Qwen/Qwen3-8B", bare=Scheme.HUB)
    assert (hub.is_hub, hub.root, hub.uri) == (True, "Qwen/Qwen3-8B", "hf://Qwen/Qwen3-8B")
    assert Location.parse("s3://b/p", bare=Scheme.HUB).is_s3
