"""Images pinned to the digests a push returned: SPECULATOR_IMAGE_DIGESTS, the rendered pods, the revision, and
the image the kubelet reports back (status.servedImage, the train job's provenance)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_harness import containerd, images, registry
from speculator_operator.api.common import stored
from speculator_operator.domain.releases import (
    DIGESTS_ENV,
    ReleaseError,
    get_release,
    operator_image,
    operator_reference,
)
from speculator_operator.planning.deployment import served_image

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
    assert got is not None
    assert stored(got) == {"revision": "r1", "image": "x/server:1@" + DIGEST, "imageId": ran}
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


class _Store:
    """containerd's image store as `ctr images list/tag/remove` see it: {reference: manifest digest}."""

    def __init__(self, refs: dict[str, str]) -> None:
        self.refs = dict(refs)

    def ctr(self, workdir: Any, *args: str, timeout: float = 60) -> None:
        if args[:3] == ("images", "tag", "--force"):
            self.refs[args[4]] = self.refs[args[3]]
        elif args[:3] == ("images", "remove", "--sync"):
            for ref in args[3:]:
                del self.refs[ref]
        else:
            raise AssertionError(f"unexpected ctr {args}")


def test_a_replaced_build_stays_under_the_harness_name_until_the_next_one_replaces_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, pause = "ghcr.io/speculator-operator/trainer:a", "localhost/speculator-pause:3.10"
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "built").write_text(f"{trainer} {'11' * 32}\n{pause} {'22' * 32}\n")
    old, new, paused = "sha256:" + "01" * 32, "sha256:" + "02" * 32, "sha256:" + "03" * 32
    store = _Store({
        trainer: old,  # the tag of the build a rebuild replaced
        f"ghcr.io/speculator-operator/trainer@{old}": old,  # and the same build by its digest
        "sha256:" + "99" * 32: old,  # the CRI plugin's name for its image id
        pause: paused,  # unchanged
    })  # fmt: skip
    monkeypatch.setattr(containerd, "image_digests", lambda workdir: dict(store.refs))
    monkeypatch.setattr(containerd, "ctr", store.ctr)
    previous = images.previous_name(trainer)
    assert previous == images.previous_name(f"ghcr.io/speculator-operator/trainer@{old}")
    assert previous.startswith(images.PREVIOUS_HOST + "/")  # a host no pod names: the kubelet never runs it

    said: list[str] = []
    gone = images.forget_replaced(tmp_path / "w", tmp_path, {trainer: new, pause: paused}, said.append)
    assert sorted(gone) == sorted([trainer, f"ghcr.io/speculator-operator/trainer@{old}", "sha256:" + "99" * 32])
    # the old build's manifest is still named, so its layers stay for the pull of the new one
    assert store.refs == {pause: paused, previous: old}
    assert said

    # the kubelet pulled the new build; the next rebuild replaces it, and the kept name moves on to it
    store.refs[trainer] = new
    newer = "sha256:" + "04" * 32
    gone = images.forget_replaced(tmp_path / "w", tmp_path, {trainer: newer, pause: paused}, said.append)
    assert gone == [trainer]
    assert store.refs == {pause: paused, previous: new}
    # nothing replaced: nothing removed, nothing renamed
    assert images.forget_replaced(tmp_path / "w", tmp_path, {trainer: new, pause: paused}, said.append) == []
