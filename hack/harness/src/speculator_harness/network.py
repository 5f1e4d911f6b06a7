"""The real node's network, made so that nothing can leave this machine (docs/development/real-node.md §4):

- a bridge whose gateway address is the one address besides loopback that the host's servers (API
  server, S3, cluster DNS) listen on, and that the pods reach them at;
- pods get routes to the node's pod range and the Service range only (no default route: CNI config
  below);
- an nftables table the harness owns drops forwarded traffic from the bridge to anything else (after
  kube-proxy's DNAT, so a Service whose endpoints lie elsewhere is dropped too), and the pods' traffic to
  the kubelet's port on the gateway (only the API server, on this host, talks to the kubelet);
- the sysctls the node needs or that its components change are recorded first and restored by `down`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

BRIDGE = "spec-node0"
NODE_CIDR = "10.250.0.0/24"
GATEWAY = "10.250.0.1"
PREFIX = 24
NFT_TABLE = "speculator-node"
CNI_NETWORK = "speculator-node"
# what the node sets (ip_forward: a ClusterIP answered by a pod on the bridge is routed back to it) and
# what its components are known to change (kubelet: overcommit and panic; kube-proxy: conntrack)
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
)


def _run(*argv: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, input=stdin, timeout=60)


def read_sysctls() -> dict[str, str]:
    out = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = Path("/proc/sys", name).read_text().strip()
    return out


def write_sysctl(name: str, value: str) -> None:
    Path("/proc/sys", name).write_text(value + "\n")


def restore_sysctls(recorded: dict[str, str]) -> list[str]:
    """Put back every recorded value that differs now; returns the names restored."""
    restored = []
    for name, value in recorded.items():
        try:
            if Path("/proc/sys", name).read_text().strip() != value:
                write_sysctl(name, value)
                restored.append(name)
        except OSError:
            continue
    return restored


KUBELET_PORTS = "10250, 10248"


def nft_rules(service_cidr: str) -> str:
    return f"""table inet {NFT_TABLE} {{
    chain input {{
        type filter hook input priority filter - 10; policy accept;
        iifname "{BRIDGE}" ip daddr {GATEWAY} tcp dport {{ {KUBELET_PORTS} }} counter drop
    }}
    chain forward {{
        type filter hook forward priority filter - 10; policy accept;
        iifname "{BRIDGE}" meta nfproto ipv6 counter drop
        iifname "{BRIDGE}" ip daddr != {{ {NODE_CIDR}, {service_cidr} }} counter drop
    }}
}}
"""


def cni_config(ipam_dir: Path, service_cidr: str) -> dict[str, Any]:
    """The bridge network of the node's pods: the gateway on the bridge, routes to the pod and Service
    ranges only, no masquerading, hairpin for a pod reaching itself through its Service."""
    return {
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": NODE_CIDR, "rangeStart": "10.250.0.10", "gateway": GATEWAY}]],
                    "routes": [{"dst": service_cidr}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "loopback"},
        ],
    }


def up(service_cidr: str) -> dict[str, Any]:
    """Make the bridge and the drop rule and enable forwarding; returns what `down` needs to undo it."""
    recorded = read_sysctls()
    undo: dict[str, Any] = {"sysctls": recorded, "bridge": BRIDGE, "nft_table": NFT_TABLE}
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "replace", f"{GATEWAY}/{PREFIX}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # a ClusterIP this host dials before kube-proxy has programmed it goes to the bridge, not out of the
    # machine's default route (the route goes with the bridge)
    _run("ip", "route", "replace", service_cidr, "dev", BRIDGE)
    _run("nft", "-f", "-", stdin=nft_rules(service_cidr))
    write_sysctl("net/ipv4/ip_forward", "1")
    return undo


def down(undo: dict[str, Any]) -> list[str]:
    """Remove the drop rule and the bridge and restore the sysctls; returns what was undone."""
    done = []
    bridge = str(undo.get("bridge", BRIDGE))
    if _run("nft", "delete", "table", "inet", str(undo.get("nft_table", NFT_TABLE)), check=False).returncode == 0:
        done.append("nft table")
    # a pod's veth whose namespace is still being torn down (after a node killed without its teardown)
    ports = _run("ip", "-o", "link", "show", "master", bridge, check=False).stdout
    for name in (line.split(":")[1].strip().split("@")[0] for line in ports.splitlines() if ":" in line):
        if _run("ip", "link", "del", name, check=False).returncode == 0:
            done.append(f"link {name}")
    if _run("ip", "link", "del", bridge, check=False).returncode == 0:
        done.append("bridge")
    done += restore_sysctls(undo.get("sysctls") or {})
    return done


def kube_proxy_serves(ip: str) -> bool:
    """Whether kube-proxy's nft rules answer this ClusterIP yet (read from its table, nothing sent)."""
    out = _run("nft", "list", "table", "ip", "kube-proxy", check=False)
    return out.returncode == 0 and f"{ip} . " in out.stdout


def drop_rule_present() -> bool:
    out = _run("nft", "-j", "list", "table", "inet", NFT_TABLE, check=False)
    if out.returncode != 0:
        return False
    rules = [r["rule"] for r in json.loads(out.stdout).get("nftables", []) if "rule" in r]
    return any(any("drop" in e for e in r.get("expr", [])) for r in rules)
