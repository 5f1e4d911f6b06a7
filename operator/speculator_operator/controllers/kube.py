"""What both controllers do against the API server: one client, Secrets, server-side apply of rendered
children (written only when their rendered form changed), and status patches of only what changed."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.reconcile import merge_patch

FIELD_MANAGER = "speculator-operator"
APPLIED = "speculators.dev/applied-hash"
RETRY_SECONDS = 30


def load_config() -> None:
    """In a pod: the service account; elsewhere: the KUBECONFIG read now (the client reads it once, at
    import, so a later setting is passed explicitly)."""
    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


@functools.cache
def api() -> client.ApiClient:
    """One client (one connection pool) for the process, made after the startup handler loaded the config."""
    return client.ApiClient()


class CredentialsError(Exception):
    pass


def secret_data(namespace: str, name: str | None) -> dict[str, str] | None:
    if not name:
        return None
    try:
        secret = client.CoreV1Api(api()).read_namespaced_secret(name, namespace)
    except ApiException as exc:
        raise CredentialsError(f"Secret {namespace}/{name}: {exc.reason}") from None
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def current_child(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        dep = client.AppsV1Api(api()).read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    result: dict[str, Any] = api().sanitize_for_serialization(dep)
    return result


def read_child(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """A child as the API server has it now (managed fields included), or None when it does not exist."""
    resource = DynamicClient(api()).resources.get(api_version=api_version, kind=kind)
    try:
        obj: dict[str, Any] = resource.get(name=name, namespace=namespace).to_dict()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = client.CoreV1Api(api()).list_namespaced_pod(namespace, label_selector=selector)
    serialize = api().sanitize_for_serialization
    return [serialize(p) for p in pods.items]


def _applied_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def apply_children(children: list[dict[str, Any]], force: bool = False) -> int:
    """Server-side apply each child whose rendered form changed (every child with `force`: one changed by
    hand keeps our annotation but not our values); returns how many the API server changed (an apply
    that changes nothing leaves the resourceVersion as it was)."""
    dyn = DynamicClient(api())
    changed = 0
    # the Deployment last: once its pods are ready the object reports Ready, so the rest must exist by then
    for child in sorted(children, key=lambda c: c["kind"] == "Deployment"):
        digest = _applied_hash(child)
        body = json.loads(json.dumps(child))
        body["metadata"].setdefault("annotations", {})[APPLIED] = digest
        resource = dyn.resources.get(api_version=child["apiVersion"], kind=child["kind"])
        meta = child["metadata"]
        version = None
        try:
            existing = resource.get(name=meta["name"], namespace=meta["namespace"])
            version = existing.metadata.resourceVersion
            if not force and (existing.metadata.annotations or {}).get(APPLIED) == digest:
                continue
        except ApiException as exc:
            if exc.status != 404:
                raise
        applied = resource.server_side_apply(body=body, name=meta["name"], namespace=meta["namespace"],
                                             field_manager=FIELD_MANAGER, force_conflicts=True)  # fmt: skip
        changed += applied.metadata.resourceVersion != version
    return changed


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


def write_status(plural: str, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    delta = status_patch(old, new)
    if delta:
        client.CustomObjectsApi(api()).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, name, {"status": delta}
        )


def api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", ""))[:500]
    except ValueError:
        return str(exc.body)[:500]
