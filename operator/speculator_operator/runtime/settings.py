"""The operator's settings: what the chart (or whoever starts `speculator-operator run`) tells it through its
environment, read once when the operator starts (controllers.configure, kopf's start-up handler) and handed to
the planners from here; nothing else reads these variables.

- SPECULATOR_IMAGE_PULL_SECRETS: comma-separated names of Secrets (kubernetes.io/dockerconfigjson) in each
  watched namespace; every pod the operator renders (stage Jobs, extraction and serving pods, a group's leader and
  workers) names them in `imagePullSecrets`, so that its images come from a registry that wants credentials. The
  chart sets it from `imagePullSecrets`, the same list its own operator pod pulls with.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

PULL_SECRETS_ENV = "SPECULATOR_IMAGE_PULL_SECRETS"
# a Secret's name: a DNS-1123 subdomain (Kubernetes' rule for most object names)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class SettingsError(ValueError):
    """A malformed setting: the operator refuses to start, naming the variable and the value."""


@dataclass(frozen=True)
class Settings:
    image_pull_secrets: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        raw = environ.get(PULL_SECRETS_ENV, "")
        names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
        bad = [n for n in names if len(n) > 253 or not _SUBDOMAIN.fullmatch(n)]
        if bad:
            raise SettingsError(
                f"{PULL_SECRETS_ENV}: not Secret names (DNS-1123 subdomains, comma-separated): {', '.join(bad)}"
            )
        return cls(image_pull_secrets=names)


_current: Settings | None = None


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings (from the process's environment unless given) and keep them for `current`."""
    global _current
    _current = Settings.from_env(os.environ if environ is None else environ)
    return _current


def current() -> Settings:
    """The settings read at start; the defaults where nothing loaded them (a planner run outside the operator)."""
    return _current if _current is not None else Settings()
