"""What both controllers do against the API server: one client, Secrets, server-side apply of rendered
children (written only when their rendered form changed), and status patches of only what changed."""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import urllib3
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.resource import Resource

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.api.labels import APPLIED_ANNOTATION
from speculator_operator.planning import merge_patch
from speculator_operator.runtime import metrics

APPLIED = APPLIED_ANNOTATION
FIELD_MANAGER = "speculator-operator"
RETRY_SECONDS = 30
# how often each object is compared with its children although no event came (controller-runtime's SyncPeriod):
# a missed event, or what only a read can see (a Job controller's FailedCreate event), is caught by then; the
# first comparison waits until the object has been still for half of it
RESYNC_SECONDS = float(os.environ.get("SPECULATOR_RESYNC_SECONDS", "60"))
KINDS = {"speculatordeployments": "SpeculatorDeployment", "speculatortrainjobs": "SpeculatorTrainJob"}
log = logging.getLogger(__name__)


def load_config() -> None:
    """In a pod: the service account; elsewhere: the KUBECONFIG read now (the client reads it once, at
    import, so a later setting is passed explicitly)."""
    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


# Threads per kind's work queue (runtime/controller.py), where the passes run: they wait on the API server and S3
# more than on the CPU. At 1,000 resources 16 threads and 32 gave the same figures; a burst of train jobs
# reaches its first Job sooner with 32 (their reconciles wait on S3).
HANDLER_WORKERS = int(os.environ.get("SPECULATOR_WORKERS", "32"))
# Workers per queue that take only quick passes (a child ready, a stage Job done): a burst of audits never
# holds them. Sized per kind (docs/performance/README.md): at 1,000 new SpeculatorDeployments 8 were busy most of
# the time and a child's readiness waited for one in bursts; 16 took as long per pass and cut those waits. At 100
# train jobs a stage's pass waited 2 ms for one of 8, and 16 only ran more passes against the API server at once
# (stage -> next stage p95 0.30 s with 8, about 0.5 s with 16).
QUICK_WORKERS = int(os.environ.get("SPECULATOR_QUICK_WORKERS", "16"))
TRAINJOB_QUICK_WORKERS = int(os.environ.get("SPECULATOR_TRAINJOB_QUICK_WORKERS", "8"))
# periodic work (resyncs, input polls, retries: runtime/scheduler.py) has a pool of its own too
PERIODIC_WORKERS = int(os.environ.get("SPECULATOR_PERIODIC_WORKERS", "4"))


def unreachable(exc: BaseException) -> str | None:
    """One line for a failure of the API server itself (no connection, a 5xx, a 429), else None: while it
    restarts, every reader fails at once, and a traceback from each would bury what happened."""
    if isinstance(exc, ApiException):
        if exc.status is not None and (exc.status >= 500 or exc.status == 429):
            return f"{exc.status} {exc.reason}"
        return None
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        reason = getattr(exc, "reason", None)  # MaxRetryError: the last attempt's error
        return f"{type(exc).__name__}: {reason or exc}"[:300]
    return None


def waited(lane: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, counting in the lane's wait histogram the time from now until a thread of the pool starts it."""
    queued = time.monotonic()

    def run(*args: Any) -> Any:
        metrics.LANE_WAIT.labels(lane).observe(time.monotonic() - queued)
        return fn(*args)

    return run


@functools.cache
def api() -> client.ApiClient:
    """One client (one connection pool) for the process, made after the startup handler loaded the config,
    with a connection for each thread that may call at once (urllib3's default of 10 would close and
    reopen TLS connections all through a burst)."""
    configuration = client.Configuration.get_default_copy()
    queues = 2 * HANDLER_WORKERS + QUICK_WORKERS + TRAINJOB_QUICK_WORKERS  # both kinds' work queues
    configuration.connection_pool_maxsize = queues + PERIODIC_WORKERS + 8
    return client.ApiClient(configuration)


_discovery = threading.Lock()


@functools.cache
def resource_for(api_version: str, kind: str) -> Resource:
    """The dynamic client's handle on a kind, looked up once per process. A DynamicClient reads the discovery
    cache file and asks the API server for its version each time one is made: made per apply, a burst of
    reconciles did that on every handler thread at once. Its lazy discovery updates shared state, so the
    lookups take turns."""
    with _discovery:
        return cast(Resource, _dynamic().resources.get(api_version=api_version, kind=kind))


_served: dict[str, float] = {}  # group/version -> when discovery last said it is not served (math.inf: it is)
NOT_SERVED_SECONDS = 5.0  # how long "not served" is believed before discovery is asked again


def api_served(group_version: str) -> bool:
    """Whether the API server serves `group/version`, from discovery (which every authenticated user may read: no
    right on CRDs is needed). Once served, believed for the process's life; "not served" is asked again after a few
    seconds, so that an API installed later (the LeaderWorkerSet CRD) is found by the next pass that needs it."""
    seen = _served.get(group_version)
    if seen == math.inf:
        return True
    if seen is not None and time.monotonic() - seen < NOT_SERVED_SECONDS:
        return False
    group, _, version = group_version.partition("/")
    found = client.ApisApi(api()).get_api_versions()
    served = any(g.name == group and any(v.version == version for v in g.versions) for g in found.groups)
    _served[group_version] = math.inf if served else time.monotonic()
    return served


@functools.cache
def _dynamic() -> DynamicClient:
    return DynamicClient(api())


def _json(response: Any) -> Any:
    """A dynamic client's raw answer (`serialize=False`) decoded: the API server's JSON as plain dicts. The
    reconciles do not use the typed APIs (CoreV1Api, AppsV1Api, BatchV1Api, CustomObjectsApi): importing
    CoreV1Api alone builds pydantic validators for its 400 methods (measured: 19 MiB of the process's
    resident set, 29 MiB for the four), and their answers are pydantic models that would only be turned
    back into these dicts. Only the start's permission check and the leader's Lease use typed ones."""
    return json.loads(response.data)


class CredentialsError(Exception):
    pass


def secret_data(namespace: str, name: str | None) -> dict[str, str] | None:
    if not name:
        return None
    try:
        secret = _json(resource_for("v1", "Secret").get(name=name, namespace=namespace, serialize=False))
    except ApiException as exc:
        raise CredentialsError(f"Secret {namespace}/{name}: {exc.reason}") from None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


def current_child(
    namespace: str, name: str, api_version: str = "apps/v1", kind: str = "Deployment"
) -> dict[str, Any] | None:
    return read_child(api_version, kind, namespace, name)


def read_child(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """An object as the API server has it now (managed fields included), or None when it does not exist."""
    try:
        found = resource_for(api_version, kind).get(name=name, namespace=namespace, serialize=False)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return cast(dict[str, Any], _json(found))


def list_objects(
    api_version: str,
    kind: str,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> list[dict[str, Any]]:
    """The objects of a kind (in a namespace, or all), as the API server's JSON."""
    resource = resource_for(api_version, kind)
    found = resource.get(
        namespace=namespace, label_selector=label_selector, field_selector=field_selector, serialize=False
    )
    return cast(list[dict[str, Any]], _json(found).get("items") or [])


def delete_object(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete an object; one already gone is not an error (False)."""
    try:
        resource_for(api_version, kind).delete(name=name, namespace=namespace, serialize=False)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def custom(plural: str) -> Resource:
    """The dynamic client's handle on one of the project's own kinds, by its plural."""
    return resource_for(f"{GROUP}/{VERSION}", KINDS[plural])


def read_custom(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One of the project's own objects as stored now, or None when it does not exist."""
    return read_child(f"{GROUP}/{VERSION}", KINDS[plural], namespace, name)


def list_custom(plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
    return list_objects(f"{GROUP}/{VERSION}", KINDS[plural], namespace)


def create_custom(plural: str, namespace: str, body: dict[str, Any]) -> None:
    custom(plural).create(body=body, namespace=namespace, serialize=False)


def patch_custom(plural: str, namespace: str, name: str, patch: dict[str, Any], status: bool = False) -> None:
    """A JSON merge patch of the object (of its status subresource with `status`)."""
    target = custom(plural).status if status else custom(plural)
    merge = "application/merge-patch+json"
    target.patch(body=patch, name=name, namespace=namespace, content_type=merge, serialize=False)


LOG_TIMEOUT = 10.0  # seconds for a stage pod's log tail: a node that does not answer costs one lane this long


def _networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    raw = os.environ.get("SPECULATOR_SCRAPE_NETWORKS", "")
    return [ipaddress.ip_network(n.strip(), strict=False) for n in raw.split(",") if n.strip()]


NETWORKS = _networks()


def dialable(ip: str) -> bool:
    """An address that may be dialled for the operator: a serving pod it scrapes, or a stage pod's node,
    which the API server dials for its log. SPECULATOR_SCRAPE_NETWORKS (comma-separated CIDRs; unset: any)
    keeps out addresses that are data only, such as kwok's fake pods and nodes."""
    if not NETWORKS:
        return True
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in net for net in NETWORKS)


def pod_log(namespace: str, name: str, container: str, tail_lines: int = 400, limit_bytes: int = 256 * 1024) -> str:
    """The tail of a container's log (pods/log: read only), as text; an unreadable byte is replaced."""
    query = [("container", container), ("tailLines", str(tail_lines)), ("limitBytes", str(limit_bytes))]
    answer = _dynamic().request(
        "get",
        f"/api/v1/namespaces/{namespace}/pods/{name}/log",
        query_params=query,
        header_params={"Accept": "*/*"},
        _request_timeout=LOG_TIMEOUT,
    )
    data = getattr(answer, "data", answer)  # the transport's raw response, or its text already read
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)


def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    return list_objects("v1", "Pod", namespace, label_selector=selector)


def _applied_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class Applied(NamedTuple):
    """One child as the apply found it (None: absent) and as the API server returned it."""

    before: dict[str, Any] | None
    after: dict[str, Any]


# how often a restoring apply re-reads a child that moved between its read and its apply (a status write)
_EXACT_TRIES = 5


def apply_children(
    children: list[dict[str, Any]],
    force: bool = False,
    known: Mapping[tuple[str, str], dict[str, Any] | None] | None = None,
) -> dict[tuple[str, str], Applied]:
    """Server-side apply each child whose rendered form changed; returns, by (kind, name), each applied child
    before and after. `known` holds children this pass has just listed, by (kind, name) (None: listed as
    absent): those are not read again.

    With `force` (a restoration: one was changed by hand and keeps our annotation but not our values) every
    child is read right before it is applied (not taken from `known`: a rolling Deployment's status moves
    every moment) and applied against that object: the apply carries its resourceVersion, and a child that
    moved in between (its status written, an edit landing) is read again and applied again.
    So `before` is exactly what the apply replaced: what it took back from other managers is the difference,
    never an edit that landed after it, nor a status write (either would move the resourceVersion)."""
    applied: dict[tuple[str, str], Applied] = {}
    # the workload last: once its pods are ready the object reports Ready, so the rest must exist by then
    for child in sorted(children, key=lambda c: c["kind"] in WORKLOAD_KINDS):
        digest = _applied_hash(child)
        meta = child["metadata"]
        ref = (child["kind"], meta["name"])
        if known is not None and ref in known and not force:
            existing = known[ref]
        else:
            existing = read_child(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
        unchanged = existing is not None and (existing["metadata"].get("annotations") or {}).get(APPLIED) == digest
        if unchanged and not force:
            continue
        for attempt in range(_EXACT_TRIES):
            body = json.loads(json.dumps(child))
            body["metadata"].setdefault("annotations", {})[APPLIED] = digest
            if force and existing is not None:
                body["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
            try:
                after = _server_side_apply(child["apiVersion"], child["kind"], body)
            except ApiException as exc:
                if not (force and exc.status == 409 and attempt + 1 < _EXACT_TRIES):
                    raise
                existing = read_child(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
                continue
            applied[ref] = Applied(existing, after)
            break
    return applied


def _server_side_apply(api_version: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    resource = resource_for(api_version, kind)
    out = resource.server_side_apply(body=body, name=meta["name"], namespace=meta["namespace"],
                                     field_manager=FIELD_MANAGER, force_conflicts=True)  # fmt: skip
    return cast(dict[str, Any], out.to_dict())


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Only what changed (None removes a key), so an unchanged world writes nothing; a changed object is a
    merge patch of its own, so that a key it lost is removed from the stored status too."""
    patch: dict[str, Any] = {}
    for k, v in new.items():
        if old.get(k) == v:
            continue
        patch[k] = merge_patch(old[k], v) if isinstance(old.get(k), dict) and isinstance(v, dict) else v
    for k in old:
        if k not in new and not k.startswith("_"):
            patch[k] = None
    return patch


def patch_status(plural: str, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any], cause: str) -> None:
    """The one status write of a pass: a merge patch of what changed from `old` (the status as the pass read it)
    to `new`, with no resourceVersion precondition and no second read. The pass is the only writer of the
    object's status (one pass per object at a time: runtime/controller.py), so nothing it did not change can
    have moved meanwhile; a precondition would only turn the user's spec edits into 409s. `cause` labels the
    operator's count of its status writes."""
    delta = status_patch(old, new)
    if not delta:
        return
    log.debug("%s/%s: status write (%s): %s", namespace, name, cause, ", ".join(sorted(delta)))
    try:
        patch_custom(plural, namespace, name, {"status": delta}, status=True)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return  # deleted meanwhile: nothing to write to
    metrics.STATUS_WRITES.labels(KINDS[plural], cause).inc()


def api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", ""))[:500]
    except ValueError:
        return str(exc.body)[:500]


def namespace_terminating(exc: ApiException) -> bool:
    """A create refused because the namespace is being deleted (403, cause NamespaceTerminating): the owner
    goes with it, so there is nothing to retry and nothing to report. The operator may not read namespaces
    (a namespaced install), so the refusal itself is the signal."""
    if exc.status != 403:
        return False
    try:
        causes = (json.loads(exc.body or "{}").get("details") or {}).get("causes") or []
    except ValueError:
        return False
    return any(c.get("reason") == "NamespaceTerminating" for c in causes if isinstance(c, dict))
