"""The recorded evidence of the release under check (domain/qualification.py) is still about the images built here: it
goes stale when what an image runs on changes (any installed distribution but this package, so its stack digest), and
then this fails, naming the command that records it again. CI builds the default release's trainer image, so this runs
on every CI run for it; the CUDA server image is compared where it is built (hack/test-images, hack/qualify-release).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from speculator_operator.domain.qualification import evidence

from .images import EVIDENCE_ENV, IMAGES, podman, qualifying

pytestmark = [pytest.mark.workloads, pytest.mark.images]


def test_the_recorded_evidence_is_about_the_images_built_here(trainer_image: str) -> None:
    if os.environ.get(EVIDENCE_ENV):
        pytest.skip("this session records the evidence again")
    release = qualifying()
    recorded = evidence(release.name)
    assert recorded is not None, f"no evidence recorded for {release.name}: run hack/qualify-release {release.name}"
    assert recorded.passed, [c.name for c in recorded.failed]
    server = release.reference("server", "cuda")
    if subprocess.run([*podman(), "image", "exists", server], capture_output=True).returncode == 0:
        from .images import record_image

        record_image("server", server)
    compared = {role: image for role, image in IMAGES.items() if role in recorded.images}
    assert "trainer" in compared
    for role, image in compared.items():
        was = recorded.images[role]
        moved = {k: (was.installed.get(k), v) for k, v in image.installed.items() if was.installed.get(k) != v}
        moved |= {k: (v, None) for k, v in was.installed.items() if k not in image.installed}
        assert image.stack == was.stack, (
            f"{release.name}'s evidence is stale for its {role} image ({len(moved)} distributions moved, e.g. "
            f"{dict(list(sorted(moved.items()))[:5])}): run hack/qualify-release {release.name}"
        )
