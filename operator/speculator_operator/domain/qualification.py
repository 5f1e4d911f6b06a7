"""How far this project has proven a release (docs/concepts/releases.md): the levels, and the evidence that
`hack/qualify-release NAME` records for one.

- Served: vLLM's CPU build of the release exists, and every CI run serves drafts with it, end to end (the
  workloads lane and the real node's pods); its static evidence is recorded as well.
- Checked: no CPU build exists (vLLM publishes one for some releases only), so nothing here can serve it. The
  release's images were built and checked without a device: the versions installed in them are the release
  table's; speculators trains every algorithm on that torch (`train --dry-run`) and the audit passes those
  checkpoints for that vLLM; vLLM's own argument parser and config validation accept every rendered serving and
  extraction command; hs-connectors implements that vLLM's KV-connector API; and the keys, types and metric
  names the renderer and the scrape use are in that vLLM's source.
- Unqualified: neither. `get_release` refuses it; the table row is there to be qualified.

The evidence is a JSON file per release beside this module (evidence/<release>.json), written by
hack/qualify-release and committed with the change that qualified it. It names the images the checks ran in by
their digest and by their stack: a hash of every Python distribution installed in them but this package, so that
a change to this package (a new image layer, a new digest) does not unqualify a release, while any change of
what the release runs on does (tests/workloads/test_release_evidence.py compares it with the images built here).
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

EVIDENCE_DIR = Path(__file__).with_name("evidence")
THIS_PACKAGE = "speculator-operator"


class Level(StrEnum):
    SERVED = "Served"
    CHECKED = "Checked"
    UNQUALIFIED = "Unqualified"


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Check(Record):
    """One check of a qualification: its name, whether it passed, and what it saw."""

    name: str
    passed: bool
    detail: str = ""


class ImageEvidence(Record):
    """An image a qualification's checks ran in."""

    reference: str
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    stack: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")  # stack_digest() of what is installed in it
    installed: dict[str, str]  # distribution -> version, this package left out


class Evidence(Record):
    """What `hack/qualify-release` recorded for a release."""

    release: str
    recorded: str  # the date (UTC) it was recorded
    machine: str  # where: the machine's kind, cores and memory
    command: str
    images: dict[str, ImageEvidence]  # by role: trainer, server (the CUDA build), server-cpu where one exists
    checks: list[Check]
    served: str  # how the release was served here, or that it could not be (no CPU build of its vLLM)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]


def normalize(name: str) -> str:
    """A distribution's name as packaging compares them (PEP 503)."""
    return "-".join(part for part in name.lower().replace("_", "-").replace(".", "-").split("-") if part)


def installed_versions(freeze: str) -> dict[str, str]:
    """`pip list --format=freeze` output as {distribution: version}, this package left out."""
    out: dict[str, str] = {}
    for line in freeze.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and normalize(name) != THIS_PACKAGE:
            out[normalize(name)] = version.strip()
    return dict(sorted(out.items()))


def stack_digest(installed: dict[str, str]) -> str:
    """The identity of what an image runs on: every distribution and its version, this package left out."""
    text = "\n".join(f"{normalize(k)}=={v}" for k, v in sorted(installed.items()) if normalize(k) != THIS_PACKAGE)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def evidence_path(release: str) -> Path:
    return EVIDENCE_DIR / f"{release}.json"


def evidence(release: str) -> Evidence | None:
    """The recorded evidence of `release`, or None where none was recorded."""
    path = evidence_path(release)
    if not path.is_file():
        return None
    return Evidence.model_validate(json.loads(path.read_text()))


def level(release: str, served_on_cpu: str) -> Level:
    """The level of `release`: Served where CI serves it on vLLM's CPU build (`served_on_cpu` says how: every CI
    run proves it again), else Checked where its recorded evidence passed, else Unqualified."""
    if served_on_cpu:
        return Level.SERVED
    recorded = evidence(release)
    return Level.CHECKED if recorded is not None and recorded.passed else Level.UNQUALIFIED
