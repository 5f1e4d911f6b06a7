"""kube-apiserver: the real API server (validation, CEL, categories, printer columns), with an audit log
of writes that the tests count, and the kubeconfig that reaches it.

It listens on one address: loopback, or — with the real node — the node bridge's gateway address, which
this host and the node's pods both reach; then it also publishes that address as the endpoint of the
`kubernetes` Service, so in-cluster clients (the operator's pod) find it through kube-proxy.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

from speculator_harness.process import Supervisor, http_get

SERVICE_CIDR = "10.96.0.0/16"  # room for thousands of Services
KUBERNETES_SERVICE_IP = "10.96.0.1"


class Api:
    """A minimal client of the API server (the harness needs no more than JSON over TLS)."""

    def __init__(self, server: str, ctx: ssl.SSLContext) -> None:
        self.server = server
        self.ctx = ctx

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        # a PATCH is a JSON merge patch; everything else sends a whole object
        kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
        req = urllib.request.Request(  # noqa: S310 (https to a local address)
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": kind, "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:  # noqa: S310 (a local address)
            result: dict[str, Any] = json.loads(resp.read())
            return result


def audit_log(workdir: Path) -> Path:
    return workdir / "logs" / "audit.jsonl"


def start(sup: Supervisor, pki: dict[str, Path], etcd: str, address: str, publish_endpoint: bool) -> Api:
    """Start the API server on `address`; returns a client of it (admin credentials)."""
    # an audit log of every write (and of reads of our own kinds), so tests can count API requests
    policy = sup.workdir / "audit-policy.yaml"
    rules = [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "Metadata", "resources": [{"group": "speculators.dev"}]},
        {"level": "None"},
    ]
    audit_policy = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"]}
    policy.write_text(json.dumps({**audit_policy, "rules": rules}))
    ctx = ssl.create_default_context(cafile=str(pki["ca.crt"]))
    ctx.load_cert_chain(str(pki["admin.crt"]), str(pki["admin.key"]))

    def argv() -> list[str]:
        port = sup.port("kube-apiserver")
        return [
            sup.bin("kube-apiserver"),
            f"--etcd-servers={etcd}",
            f"--bind-address={address}",
            f"--secure-port={port}",
            f"--advertise-address={address}",
            # without the real node no pod runs that could reach it: no endpoint to publish
            f"--endpoint-reconciler-type={'lease' if publish_endpoint else 'none'}",
            f"--cert-dir={sup.workdir / 'pki'}",
            f"--tls-cert-file={pki['apiserver.crt']}",
            f"--tls-private-key-file={pki['apiserver.key']}",
            f"--client-ca-file={pki['ca.crt']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer=https://{address}:{port}",
            f"--service-account-key-file={pki['sa.pub']}",
            f"--service-account-signing-key-file={pki['sa.key']}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log(sup.workdir)}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=200",
        ]

    def server() -> str:
        return f"https://{address}:{sup.ports['kube-apiserver']}"

    sup.launch("kube-apiserver", argv, lambda: http_get(f"{server()}/readyz", ctx).strip() == "ok")
    return Api(server(), ctx)


def kubeconfig(server: str, pki: dict[str, Path], user: str = "admin", name: str = "speculator-local") -> str:
    """A kubeconfig for `server` with the client certificate `<user>.crt` of the local CA."""

    def b64(key: str) -> str:
        return base64.b64encode(pki[key].read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [
            {
                "name": f"{name}-{user}",
                "user": {"client-certificate-data": b64(f"{user}.crt"), "client-key-data": b64(f"{user}.key")},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-{user}", "namespace": "default"}}],
        "current-context": name,
    }
    return json.dumps(config, indent=2)


def write_kubeconfig(path: Path, server: str, pki: dict[str, Path], user: str = "admin") -> Path:
    path.write_text(kubeconfig(server, pki, user))
    path.chmod(0o600)
    return path
