"""Where a model, a checkpoint or a data file lives, as the specs and the pods name it: `s3://bucket/prefix`,
`hf://org/repo[@revision]` (or a bare `org/repo` where a hub id is meant), `pvc://claim/path`, or a local path.

One parse for every place that asks which store a location is in and what its parts are; the string a spec
holds stays what it is (its CRD pattern says which forms each field takes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://")


class Scheme(StrEnum):
    S3 = "s3"
    HUB = "hf"
    PVC = "pvc"
    PATH = "path"  # a local path (a folder, or a file in it), as a pod or the CLI reads it
    OTHER = "other"  # a scheme none of the above (gs://, https://): nothing reads it


@dataclass(frozen=True)
class Location:
    """A parsed location. `root` is the bucket (s3), the repo id org/name (hub), the claim (pvc) or the scheme's
    name (other); `path` is the key prefix (s3), the path in the claim (pvc) or the local path (path), as given
    (no slash added or taken off); `revision` is a hub location's `@revision`."""

    scheme: Scheme
    root: str = ""
    path: str = ""
    revision: str | None = None
    given: str = ""  # the string it was parsed from

    @classmethod
    def parse(cls, uri: str, bare: Scheme = Scheme.PATH) -> Location:
        """The location `uri` names; `bare` is what a string without a scheme is: a local path, or (a verifier's
        model) a hub id."""
        found = _SCHEME.match(uri)
        if found is None:
            if bare is Scheme.HUB:
                repo, _, revision = uri.partition("@")
                return cls(Scheme.HUB, repo, "", revision or None, uri)
            return cls(Scheme.PATH, "", uri, None, uri)
        rest = uri[found.end() :]
        name = found[1]
        if name == "s3":
            bucket, _, prefix = rest.partition("/")
            return cls(Scheme.S3, bucket, prefix, None, uri)
        if name == "pvc":
            claim, _, sub = rest.partition("/")
            return cls(Scheme.PVC, claim, sub, None, uri)
        if name == "hf":
            repo, _, revision = rest.partition("@")
            return cls(Scheme.HUB, repo, "", revision or None, uri)
        return cls(Scheme.OTHER, name, rest, None, uri)

    @property
    def is_s3(self) -> bool:
        return self.scheme is Scheme.S3

    @property
    def is_hub(self) -> bool:
        return self.scheme is Scheme.HUB

    @property
    def is_pvc(self) -> bool:
        return self.scheme is Scheme.PVC

    @property
    def is_path(self) -> bool:
        return self.scheme is Scheme.PATH

    @property
    def is_local(self) -> bool:
        """A path or a claim, which a pod reads as files (a claim where it is mounted)."""
        return self.scheme in (Scheme.PATH, Scheme.PVC)

    @property
    def uri(self) -> str:
        """The location written out: a hub id always as hf://org/repo[@revision]; the others as given."""
        if self.scheme is Scheme.HUB:
            return f"hf://{self.root}" + (f"@{self.revision}" if self.revision else "")
        return self.given
