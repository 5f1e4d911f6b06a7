"""The operator's settings: what the chart (or whoever starts `speculator-operator run`) tells it through its
environment. `speculator-operator run` reads them once, before anything else starts (runtime/entry.py), and hands
them to the controllers it starts; nothing else in the operator process reads these variables. Each is named,
with its default, range and meaning, in `VARIABLES` (docs/operations/settings.md is the same table).

Only the standard library here (and domain/images.py, which is as light): the settings are parsed before the
profiler starts, and whatever they imported would be missing from its report.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from speculator_operator.domain import images

PULL_SECRETS_ENV = "SPECULATOR_IMAGE_PULL_SECRETS"
# a Secret's name: a DNS-1123 subdomain (Kubernetes' rule for most object names)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class SettingsError(ValueError):
    """A malformed setting: the operator refuses to start, naming the variable and the value."""


@dataclass(frozen=True)
class Settings:
    # the pods the operator renders
    image_pull_secrets: tuple[str, ...] = ()
    image_repository: str = images.IMAGE_REPOSITORY
    image_digests: Mapping[str, str] = field(default_factory=dict)
    default_release: str | None = None
    # Threads per kind's work queue (runtime/controller.py), where the passes run: they wait on the API server and
    # S3 more than on the CPU. At 1,000 resources 16 threads and 32 gave the same figures; a burst of train jobs
    # reaches its first Job sooner with 32 (their reconciles wait on S3).
    workers: int = 32
    # Workers per queue that take only quick passes (a child ready, a stage Job done): a burst of audits never
    # holds them. Sized per kind (docs/performance/README.md): at 1,000 new SpeculatorDeployments 8 were busy most
    # of the time and a child's readiness waited for one in bursts; 16 took as long per pass and cut those waits.
    # At 100 train jobs a stage's pass waited 2 ms for one of 8, and 16 only ran more passes against the API
    # server at once (stage -> next stage p95 0.30 s with 8, about 0.5 s with 16).
    quick_workers: int = 16
    trainjob_quick_workers: int = 8
    # periodic work (resyncs, input polls, retries: runtime/scheduler.py) has a pool of its own too
    periodic_workers: int = 4
    # controller-runtime's SyncPeriod: a missed event, or what only a read can see (a Job controller's
    # FailedCreate event), is caught by then
    resync_seconds: float = 60.0
    poll_tick_seconds: float = 10.0
    group_poll_seconds: float = 5.0
    idle_worker_seconds: float = 0.5
    progress_seconds: float = 10.0  # api/podcontract.PROGRESS_SECONDS_DEFAULT: the pods print at the same pace
    # the acceptance scrape (controllers/telemetry.py)
    scrape_interval_seconds: float = 15.0
    scrape_timeout_seconds: float = 3.0
    scrape_concurrency: int = 16
    scrape_max_bytes: int = 2 * 1024 * 1024
    scrape_networks: tuple[Network, ...] = ()
    # the process
    metrics_port: int | None = None
    metrics_address: str | None = None
    trim_seconds: float = 10.0
    profile: str | None = None
    profile_mode: str = "trace"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """The settings `environ` gives (a variable unset or empty: its default); the first malformed one is a
        SettingsError naming the variable and the value."""
        values: dict[str, Any] = {}
        for name, variable in VARIABLES.items():
            raw = environ.get(variable.env, "").strip()
            if raw:
                try:
                    values[name] = variable.parse(raw)
                except (ValueError, images.ImagesError) as exc:
                    why = str(exc) if isinstance(exc, images.ImagesError) else f"{variable.env}: {exc}"
                    raise SettingsError(why) from None
        return cls(**values)

    def images(self) -> images.Images:
        return images.Images(self.image_repository, self.image_digests, self.default_release)

    def dialable(self, ip: str) -> bool:
        """An address that may be dialled for the operator: a serving pod it scrapes, or a stage pod's node, which
        the API server dials for its log. SPECULATOR_SCRAPE_NETWORKS (unset: any) keeps out addresses that are
        data only, such as kwok's fake pods and nodes."""
        if not self.scrape_networks:
            return True
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(address in net for net in self.scrape_networks)


def _secrets(raw: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    bad = [n for n in names if len(n) > 253 or not _SUBDOMAIN.fullmatch(n)]
    if bad:
        raise ValueError(f"not Secret names (DNS-1123 subdomains, comma-separated): {', '.join(bad)}")
    return names


def _number(kind: type[int] | type[float], low: float, high: float = math.inf) -> Callable[[str], Any]:
    """A parser of an int or a float in [low, high] (a float must be finite and above 0 where low is 0)."""

    def parse(raw: str) -> int | float:
        value = kind(raw)
        if not math.isfinite(value) or not low <= value <= high or (kind is float and low == 0 and value == 0):
            bounds = "> 0" if kind is float and low == 0 else f">= {low:g}"
            raise ValueError(f"{raw!r} must be {bounds}" + (f" and <= {high:g}" if math.isfinite(high) else ""))
        return value

    return parse


def _networks(raw: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n.strip(), strict=False) for n in raw.split(",") if n.strip())


def _one_of(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"{raw!r} must be one of {', '.join(allowed)}")
        return raw

    return parse


class Variable(NamedTuple):
    env: str
    parse: Callable[[str], Any]
    range: str  # as docs/operations/settings.md says it
    meaning: str


VARIABLES: dict[str, Variable] = {
    "image_pull_secrets": Variable(
        PULL_SECRETS_ENV, _secrets, "Secret names (DNS-1123), comma-separated",
        "Secrets (kubernetes.io/dockerconfigjson) in each watched namespace that every pod the operator renders "
        "names in `imagePullSecrets`",
    ),
    "image_repository": Variable(
        images.REPOSITORY_ENV, str, "an image repository",
        "where the rendered pods' images come from",
    ),
    "image_digests": Variable(
        images.DIGESTS_ENV, images.parse_digests, "a JSON object {image reference: sha256:<64 hex>}",
        "a reference named here is rendered as `reference@digest`: every pod runs exactly the build pushed",
    ),
    "default_release": Variable(
        images.DEFAULT_RELEASE_ENV, str, "a release name (`speculator-operator releases`)",
        "the release of a spec that names none; unset: `DEFAULT_RELEASE` of domain/releases.py",
    ),
    "workers": Variable(
        "SPECULATOR_WORKERS", _number(int, 1, 1024), "1-1024",
        "threads per kind's work queue that run passes (they wait on the API server and S3 more than on the CPU)",
    ),
    "quick_workers": Variable(
        "SPECULATOR_QUICK_WORKERS", _number(int, 0, 1024), "0-1024",
        "more threads of the SpeculatorDeployment queue that take only quick passes (a child ready)",
    ),
    "trainjob_quick_workers": Variable(
        "SPECULATOR_TRAINJOB_QUICK_WORKERS", _number(int, 0, 1024), "0-1024",
        "more threads of the SpeculatorTrainJob queue that take only quick passes (a stage Job done)",
    ),
    "periodic_workers": Variable(
        "SPECULATOR_PERIODIC_WORKERS", _number(int, 1, 1024), "1-1024",
        "threads for the periodic jobs' slow reads (a log tail, a revision)",
    ),
    "resync_seconds": Variable(
        "SPECULATOR_RESYNC_SECONDS", _number(float, 0), "> 0",
        "how often each object is compared with its children although no event came (controller-runtime's "
        "SyncPeriod); the first comparison waits until the object has been still for half of it",
    ),
    "poll_tick_seconds": Variable(
        "SPECULATOR_POLL_TICK_SECONDS", _number(float, 0), "> 0",
        "how often the input poll looks whether a deployment's upgradePolicy.pollIntervalSeconds has passed",
    ),
    "group_poll_seconds": Variable(
        "SPECULATOR_GROUP_POLL_SECONDS", _number(float, 0), "> 0",
        "how soon a multi-node deployment's pass comes again while its group is not all ready",
    ),
    "progress_seconds": Variable(
        "SPECULATOR_PROGRESS_SECONDS", _number(float, 0), "> 0",
        "how often a running train job's stage log is read for its progress line (the stage pods print one as "
        "often: api/podcontract.py reads the same variable in theirs)",
    ),
    "idle_worker_seconds": Variable(
        "SPECULATOR_IDLE_WORKER_SECONDS", _number(float, 0), "> 0",
        "how long kopf's worker for one object keeps its last event before it exits (kopf's default is 5 s)",
    ),
    "scrape_interval_seconds": Variable(
        "SPECULATOR_SCRAPE_INTERVAL_SECONDS", _number(float, 0), "> 0",
        "how often each serving deployment's pods' /metrics are scraped",
    ),
    "scrape_timeout_seconds": Variable(
        "SPECULATOR_SCRAPE_TIMEOUT_SECONDS", _number(float, 0), "> 0",
        "how long one scrape may take",
    ),
    "scrape_concurrency": Variable(
        "SPECULATOR_SCRAPE_CONCURRENCY", _number(int, 1, 4096), "1-4096", "scrapes in flight at once",
    ),
    "scrape_max_bytes": Variable(
        "SPECULATOR_SCRAPE_MAX_BYTES", _number(int, 1024), ">= 1024", "the largest /metrics body read",
    ),
    "scrape_networks": Variable(
        "SPECULATOR_SCRAPE_NETWORKS", _networks, "CIDRs, comma-separated",
        "the networks a scraped pod's (or a dialled node's) address must lie in; unset: any",
    ),
    "metrics_port": Variable(
        "SPECULATOR_METRICS_PORT", _number(int, 1, 65535), "1-65535",
        "the port of the operator's own /metrics; unset: not served",
    ),
    "metrics_address": Variable(
        "SPECULATOR_METRICS_ADDRESS", str, "an address or host name",
        "the address /metrics listens on; unset: every address",
    ),
    "trim_seconds": Variable(
        "SPECULATOR_TRIM_SECONDS", _number(float, 0), "> 0",
        "how often the C heap is trimmed (runtime/allocator.py)",
    ),
    "profile": Variable(
        "SPECULATOR_PROFILE", str, "a file path",
        "trace allocations from the start; SIGUSR1 writes the report there (runtime/profiling.py); unset: off",
    ),
    "profile_mode": Variable(
        "SPECULATOR_PROFILE_MODE", _one_of("trace", "census"), "trace, census",
        "census: count live objects only, without tracemalloc's cost",
    ),
}  # fmt: skip
assert set(VARIABLES) == {f.name for f in fields(Settings)}, "every setting has its variable"


_current: Settings | None = None


def install(settings: Settings) -> Settings:
    """The settings the operator runs with from now on (read by `current`)."""
    global _current
    _current = settings
    return settings


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings (from the process's environment unless given) and install them."""
    return install(Settings.from_env(os.environ if environ is None else environ))


def at_start() -> Settings:
    """The installed settings (`speculator-operator run` installs them before kopf starts); a bare
    `kopf run -m speculator_operator.controllers` installs none, and its first start-up handler that asks reads
    them from the environment here, once."""
    return _current if _current is not None else load()


def current() -> Settings:
    """The settings installed at start; the defaults where none were (a planner run outside the operator)."""
    return _current if _current is not None else Settings()
