"""Where the images of the pods the operator renders come from, and the release a spec that names none gets:
a registry of one's own (SPECULATOR_IMAGE_REPOSITORY, the chart's workloadImages.repository), the digests a push
returned (SPECULATOR_IMAGE_DIGESTS, the chart's workloadImages.digests) and the default release
(SPECULATOR_DEFAULT_RELEASE, the chart's defaultRelease).

The operator reads them once at start with its other settings (runtime/settings.py) and `use`s them from then on;
the CLI and the pods, which have no settings of their own, read each variable from the environment when it is
asked for. Only the standard library here: the operator parses its settings before it imports the rest
(runtime/entry.py)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

IMAGE_REPOSITORY = "ghcr.io/speculator-operator"
REPOSITORY_ENV = "SPECULATOR_IMAGE_REPOSITORY"  # a registry of one's own (the chart's images.repository)
# {image reference: manifest digest} (JSON; the chart's workloadImages.digests): a reference named here is
# rendered as `reference@digest`, so that every pod runs exactly the build that was pushed, whatever the tag
# names by the time a node pulls it
DIGESTS_ENV = "SPECULATOR_IMAGE_DIGESTS"
DEFAULT_RELEASE_ENV = "SPECULATOR_DEFAULT_RELEASE"


class ImagesError(ValueError):
    """A malformed image setting; the message names the variable."""


def parse_digests(text: str) -> dict[str, str]:
    """The digests a SPECULATOR_IMAGE_DIGESTS value pins (empty when blank); a malformed value is an error naming
    it."""
    text = text.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ImagesError(f"{DIGESTS_ENV} is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise ImagesError(f"{DIGESTS_ENV} must be a JSON object of image references to digests: {text[:200]!r}")
    bad = [k for k, v in value.items() if not re.fullmatch(r"sha256:[0-9a-f]{64}", str(v))]
    if bad:
        raise ImagesError(
            f"{DIGESTS_ENV} must map image references to sha256:<64 hex> digests; not so for: {', '.join(bad)}"
        )
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True)
class Images:
    repository: str = IMAGE_REPOSITORY
    digests: Mapping[str, str] = field(default_factory=dict)
    default_release: str | None = None  # None: domain/releases.DEFAULT_RELEASE

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Images:
        return cls(
            repository=environ.get(REPOSITORY_ENV) or IMAGE_REPOSITORY,
            digests=parse_digests(environ.get(DIGESTS_ENV, "")),
            default_release=environ.get(DEFAULT_RELEASE_ENV) or None,
        )


_used: Images | None = None  # what the operator read at start; None: read the environment when asked


def use(images: Images | None) -> None:
    """From now on, `images` (the operator's, read at start); None: the environment again."""
    global _used
    _used = images


def repository() -> str:
    if _used is not None:
        return _used.repository
    return os.environ.get(REPOSITORY_ENV) or IMAGE_REPOSITORY


def digests() -> Mapping[str, str]:
    return _used.digests if _used is not None else parse_digests(os.environ.get(DIGESTS_ENV, ""))


def default_release() -> str | None:
    return _used.default_release if _used is not None else (os.environ.get(DEFAULT_RELEASE_ENV) or None)
