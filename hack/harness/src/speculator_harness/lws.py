"""LeaderWorkerSet in the local cluster, on demand: its CRDs, its controller manager (built from the
sigs.k8s.io/lws module by hack/build-kube) and its admission webhooks, so that its pod webhook really injects
LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX into the pods of a group.

The manager runs on this machine like the other control-plane components. Its internal certificate management
would issue a certificate for `<service>.<namespace>.svc`, a name the API server here never dials; it is turned
off, and the manager serves its webhooks on 127.0.0.1 with a certificate from the harness's own CA
(pki.write_serving_cert). The webhook configurations are the module's own (config/webhook/manifests.yaml) with
what its kustomize patches add (the pod webhooks' objectSelector: only pods of a LeaderWorkerSet) and a URL in
place of the in-cluster Service.

Not started with the cluster: a test installs it where it needs it, so the operator's own "no LeaderWorkerSet
API" path runs against the same cluster first.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
from pathlib import Path
from typing import Any

import yaml

from speculator_harness.apiserver import Api
from speculator_harness.pki import write_serving_cert
from speculator_harness.process import LOOPBACK, ComponentError, Supervisor, http_get

CONFIG_DIR = "lws-config"  # beside the binaries: the module's CRDs and webhook manifests
POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def installed(api: Api) -> bool:
    try:
        api.call("GET", f"{CRD_PATH}/leaderworkersets.leaderworkerset.x-k8s.io")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def install(sup: Supervisor, api: Api, kubeconfig: Path, pki: Path, timeout: float = 60.0) -> None:
    """CRDs -> the manager (until /readyz) -> its webhook configurations. Idempotent for the CRDs."""
    config = sup.bin_dir / CONFIG_DIR
    if not (sup.bin_dir / "lws-manager").exists() or not config.is_dir():
        raise ComponentError("lws", f"lws-manager or {CONFIG_DIR} not found in {sup.bin_dir} (run hack/build-kube)")
    crds = [doc for f in sorted(config.glob("*_*.yaml")) for doc in yaml.safe_load_all(f.read_text()) if doc]
    for crd in crds:
        _create(api, CRD_PATH, crd)
    _wait_established(api, [c["metadata"]["name"] for c in crds], timeout)

    certs = sup.workdir / "lws-certs"
    write_serving_cert(pki, certs, (LOOPBACK,), "lws-webhook")
    manager_config = sup.workdir / "lws-config.yaml"

    def argv() -> list[str]:
        port, health, metrics = sup.port("lws-webhook"), sup.port("lws-manager"), sup.port("lws-metrics")
        manager_config.write_text(
            json.dumps(
                {
                    "apiVersion": "config.lws.x-k8s.io/v1alpha1",
                    "kind": "Configuration",
                    "leaderElection": {"leaderElect": False},
                    "internalCertManagement": {"enable": False},
                    "webhook": {"port": port, "host": LOOPBACK, "certDir": str(certs)},
                    "metrics": {"bindAddress": f"{LOOPBACK}:{metrics}"},
                    "health": {"healthProbeBindAddress": f"{LOOPBACK}:{health}"},
                }
            )
        )
        return [sup.bin("lws-manager"), f"--kubeconfig={kubeconfig}", f"--config={manager_config}"]

    def ready() -> bool:
        return http_get(f"http://{LOOPBACK}:{sup.ports['lws-manager']}/readyz", None) == "ok"

    sup.launch("lws-manager", argv, ready)
    ca = (pki / "ca.crt").read_bytes()
    base = f"https://{LOOPBACK}:{sup.ports['lws-webhook']}"
    for doc in yaml.safe_load_all((config / "manifests.yaml").read_text()):
        if doc:
            _create(api, _webhook_path(doc["kind"]), webhook_configuration(doc, base, ca))
    _wait_webhook(sup.ports["lws-webhook"], pki, timeout)


def webhook_configuration(doc: dict[str, Any], base: str, ca: bytes) -> dict[str, Any]:
    """The module's webhook configuration, named for this install, each webhook dialled at `base` + its path and
    trusting `ca`; the pod webhooks only for pods of a LeaderWorkerSet (as the module's kustomize patches say)."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    out["metadata"] = {"name": f"lws-{doc['metadata']['name']}"}
    for hook in out["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": base + path, "caBundle": base64.b64encode(ca).decode()}
        if any("pods" in rule.get("resources", []) for rule in hook.get("rules", [])):
            hook["objectSelector"] = POD_SELECTOR
    return out


def _webhook_path(kind: str) -> str:
    plural = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations"}.get(
        kind, "validatingwebhookconfigurations"
    )
    return f"/apis/admissionregistration.k8s.io/v1/{plural}"


def _create(api: Api, path: str, body: dict[str, Any]) -> None:
    try:
        api.call("POST", path, body)
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # already there (a second install into the same cluster)
            said = exc.read()[:500]
            raise ComponentError("lws", f"creating {body['kind']} {body['metadata']['name']}: {said!r}") from None


def _wait_established(api: Api, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = 0
        for name in names:
            crd = api.call("GET", f"{CRD_PATH}/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            done += any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
        if done == len(names):
            return
        time.sleep(0.2)
    raise ComponentError("lws", f"its CRDs were not Established within {timeout:.0f} s")


def _wait_webhook(port: int, pki: Path, timeout: float) -> None:
    """Until the webhook server answers TLS with the certificate the API server will check."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            http_get(f"https://{LOOPBACK}:{port}/", ctx)
            return
        except urllib.error.HTTPError:
            return  # it answered (404 for /): TLS is up
        except (OSError, ssl.SSLError):
            time.sleep(0.2)
    raise ComponentError("lws", f"its webhook server on {LOOPBACK}:{port} did not answer within {timeout:.0f} s")
