"""Images pinned to the digests a push returned: SPECULATOR_IMAGE_DIGESTS, the rendered pods, the revision, and
the image the kubelet reports back (status.servedImage, the train job's provenance)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_operator.localcluster import containerd, registry
from speculator_operator.reconcile.deployment import served_image
from speculator_operator.releases import DIGESTS_ENV, ReleaseError, get_release, operator_image, operator_reference

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def test_a_reference_named_in_the_digests_is_rendered_by_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    r = get_release()
    trainer = r.reference("trainer")
    monkeypatch.setenv(DIGESTS_ENV, json.dumps({trainer: DIGEST, operator_reference(): OTHER}))
    assert r.image("trainer") == f"{trainer}@{DIGEST}"
    assert operator_image() == f"{operator_reference()}@{OTHER}"
    # a reference the map does not name stays by tag
    assert r.image("server", "cpu") == r.reference("server", "cpu")
    monkeypatch.delenv(DIGESTS_ENV)
    assert r.image("trainer") == trainer


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("not json", "not JSON"),
        ('["a list"]', "JSON object"),
        ('{"ghcr.io/x/trainer:1": "sha256:short"}', "ghcr.io/x/trainer:1"),
        ('{"ghcr.io/x/trainer:1": "md5:' + "0" * 32 + '"}', "ghcr.io/x/trainer:1"),
    ],
)
def test_a_malformed_digest_map_is_refused_naming_what(monkeypatch: pytest.MonkeyPatch, value: str, names: str) -> None:
    monkeypatch.setenv(DIGESTS_ENV, value)
    with pytest.raises(ReleaseError, match=DIGESTS_ENV) as err:
        get_release().image("trainer")
    assert names in str(err.value)


def _pod(
    revision: str, image_id: str | None, ready: bool = True, image: str = "x/server:1@" + DIGEST
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "vllm", "ready": ready, "image": image}
    if image_id is not None:
        status["imageID"] = image_id
    return {
        "metadata": {"labels": {"speculators.dev/revision": revision}},
        "spec": {"containers": [{"name": "vllm", "image": image}]},
        "status": {"containerStatuses": [{"name": "stage", "ready": False}, status]},
    }


def test_the_served_image_is_what_every_ready_pod_of_the_revision_runs() -> None:
    ran = f"x/server@{DIGEST}"
    got = served_image("r1", [_pod("r1", ran), _pod("r1", ran), _pod("r0", f"x/server@{OTHER}")])
    assert got == {"revision": "r1", "image": "x/server:1@" + DIGEST, "imageId": ran}
    # two builds under one revision (a tag that moved between two pulls) is not one image
    assert served_image("r1", [_pod("r1", ran), _pod("r1", f"x/server@{OTHER}", image="x/server:1")]) is None
    # a ready pod that reports no image (kwok's fakes) tells nothing
    assert served_image("r1", [_pod("r1", None)]) is None
    # pods not ready yet, or of another revision only, tell nothing either
    assert served_image("r1", [_pod("r1", ran, ready=False), _pod("r0", ran)]) is None


def test_containerd_pulls_the_images_hosts_from_the_registry_and_nothing_else(tmp_path: Any) -> None:
    refs = ["ghcr.io/speculator-operator/trainer:a", "localhost/speculator-pause:3.10"]
    assert registry.hosts(refs) == ["ghcr.io", "localhost"]
    assert registry.split_reference(refs[0]) == ("ghcr.io", "speculator-operator/trainer", "a")
    containerd.config(tmp_path / "w", tmp_path / "cache", "10.251.0.0/24", "127.0.0.1:5999", registry.hosts(refs))
    certs = tmp_path / "w" / "containerd" / "certs.d"
    assert sorted(p.name for p in certs.iterdir()) == ["_default", "ghcr.io", "localhost"]
    for host in ("ghcr.io", "localhost"):
        text = (certs / host / "hosts.toml").read_text()
        assert 'server = "http://127.0.0.1:5999"' in text
        assert '"pull", "resolve"' in text  # never push
    assert containerd.NO_REGISTRY in (certs / "_default" / "hosts.toml").read_text()
