"""The state file of a detached cluster (`hack/dev-cluster up`): what another process needs to say what
runs and to take it all down, the real node's traces included."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

from speculator_operator.localcluster import node as real_node
from speculator_operator.localcluster.apiserver import Api
from speculator_operator.localcluster.process import alive, is_ours, stop_pid

STATE_FILE = "state.json"


def write(workdir: Path, data: dict[str, Any]) -> None:
    (workdir / STATE_FILE).write_text(json.dumps(data, indent=2, default=str))


def load_state(workdir: Path) -> dict[str, Any] | None:
    path = workdir / STATE_FILE
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def running_components(workdir: Path) -> dict[str, int]:
    """The recorded components of a detached cluster that are still running (name -> pid)."""
    st = load_state(workdir)
    if st is None:
        return {}
    argv0: dict[str, str] = st.get("argv", {})
    pids: dict[str, int] = st.get("pids", {})
    return {name: pid for name, pid in pids.items() if is_ours(pid, argv0.get(name, "")) and alive(pid)}


def _api(workdir: Path, st: dict[str, Any]) -> Api | None:
    server = st.get("server")
    pki = workdir / "pki"
    if not server or not (pki / "admin.crt").exists():
        return None
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return Api(str(server), ctx)


def stop_recorded(workdir: Path, grace: float = 10.0) -> list[str]:
    """Stop the processes a detached LocalCluster recorded in `workdir` (its real node first, with its
    traces undone); returns their names."""
    st = load_state(workdir)
    if st is None:
        return []
    stopped: list[str] = []
    pids: dict[str, int] = st.get("pids", {})
    argv0: dict[str, str] = st.get("argv", {})

    def stop(name: str) -> None:
        if name in pids and stop_pid(pids[name], argv0.get(name, ""), grace):
            stopped.append(name)

    if st.get("node_record"):
        real_node.teardown(workdir, st["node_record"], _api(workdir, st), stop)
    for name in reversed(list(pids)):
        if name not in stopped:
            stop(name)
    (workdir / STATE_FILE).unlink()
    return stopped
