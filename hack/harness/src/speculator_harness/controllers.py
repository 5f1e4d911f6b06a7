"""kube-controller-manager and kube-scheduler: Jobs, Deployments, garbage collection, scheduling."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from speculator_harness.process import LOOPBACK, Supervisor, http_get


def start(sup: Supervisor, kubeconfig: Path, pki: Path) -> None:
    kc = str(kubeconfig)
    common = [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        f"--bind-address={LOOPBACK}",
        "--leader-elect=false",
    ]

    def kcm_argv() -> list[str]:
        return [
            sup.bin("kube-controller-manager"),
            *common,
            f"--secure-port={sup.port('kube-controller-manager')}",
            f"--cert-dir={sup.workdir / 'kcm-certs'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=false",
            "--profiling=false",
        ]

    def sched_argv() -> list[str]:
        return [
            sup.bin("kube-scheduler"),
            *common,
            f"--secure-port={sup.port('kube-scheduler')}",
            f"--cert-dir={sup.workdir / 'scheduler-certs'}",
            "--profiling=false",
        ]

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # their serving certs are self-signed; we only ask /healthz

    def healthy(name: str) -> Callable[[], bool]:
        return lambda: http_get(f"https://{LOOPBACK}:{sup.ports[name]}/healthz", insecure) == "ok"

    sup.launch("kube-controller-manager", kcm_argv, healthy("kube-controller-manager"))
    sup.launch("kube-scheduler", sched_argv, healthy("kube-scheduler"))
