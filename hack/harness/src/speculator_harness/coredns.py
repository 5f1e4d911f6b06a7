"""The cluster DNS of the real node: CoreDNS (hack/build-kube builds it with only the plugins it needs)
answering `*.cluster.local` from the API server on the bridge's gateway address; it has no forwarder,
so a name outside the cluster gets no answer and no query leaves this machine."""

from __future__ import annotations

from pathlib import Path

from speculator_harness.network import GATEWAY
from speculator_harness.process import LOOPBACK, Process, Supervisor, http_get


def corefile(kubeconfig: Path, ready_port: int, health_port: int) -> str:
    return f""".:53 {{
    bind {GATEWAY}
    ready {LOOPBACK}:{ready_port}
    health {LOOPBACK}:{health_port}
    errors
    cache 30
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""


def start(sup: Supervisor, kubeconfig: Path) -> Process:
    path = sup.workdir / "Corefile"

    def argv() -> list[str]:
        path.write_text(corefile(kubeconfig, sup.port("coredns-ready"), sup.port("coredns-health")))
        return [sup.bin("coredns"), "-conf", str(path)]

    def ready() -> bool:
        return http_get(f"http://{LOOPBACK}:{sup.ports['coredns-ready']}/ready", None).strip() == "OK"

    return sup.launch("coredns", argv, ready)
