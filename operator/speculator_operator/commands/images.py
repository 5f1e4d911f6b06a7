"""`speculator-operator images [--release NAME] [--build-args | --locked ROLE]`: a release's image references, its
pins as the Dockerfiles' build arguments, or the distributions its recorded evidence found in one of its images
(`name==version`, one line, space-separated: what hack/build-images installs the image with, so that an image built
on a new machine from today's index is the one the evidence is about). What hack/build-images reads."""

from __future__ import annotations

import argparse

from speculator_operator.domain.releases import get_release, release_row


def run(args: argparse.Namespace) -> int:
    from speculator_operator.domain.releases import operator_reference

    # by tag: what hack/build-images tags and pushes (the pods run them pinned to the pushed digests); any row of the
    # table, whatever its level: an unqualified release's images are what hack/qualify-release checks
    release = release_row(args.release) if args.release else get_release()
    if args.locked:
        from speculator_operator.domain.qualification import evidence

        recorded = evidence(release.name)
        image = recorded.images.get(args.locked) if recorded is not None else None
        # nothing recorded yet (a release's first qualification): nothing locked
        print(" ".join(f"{k}=={v}" for k, v in sorted((image.installed if image else {}).items())))
        return 0
    if args.build_args:
        for key, value in (("SPECULATOR_RELEASE", release.name), ("VLLM_VERSION", release.vllm),
                           ("TORCH_VERSION", release.torch), ("TRANSFORMERS_VERSION", release.transformers),
                           ("SPECULATORS_VERSION", release.speculators),
                           ("HS_CONNECTORS_VERSION", release.hs_connectors)):  # fmt: skip
            print(f"{key}={value}")
        return 0
    print(f"operator {operator_reference()}")
    print(f"trainer {release.reference('trainer')}")
    print(f"server {release.reference('server')}")
    print(f"server-cpu {release.reference('server', 'cpu')}")
    return 0
