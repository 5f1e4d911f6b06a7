"""The state file of a detached cluster (`hack/dev-cluster up`): what another process needs to say what
runs and to take it all down, the real node's traces included."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

from speculator_harness import node as real_node
from speculator_harness import traces
from speculator_harness.apiserver import Api
from speculator_harness.process import alive, is_ours, stop_pid

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
        # the API server asks the kubelet to stop the pods; when it is gone, what is left is killed
        api = _api(workdir, st) if "kube-apiserver" in running_components(workdir) else None
        real_node.teardown(workdir, st["node_record"], api, stop)
    for name in reversed(list(pids)):
        if name not in stopped:
            stop(name)
    (workdir / STATE_FILE).unlink()
    return stopped


def recover_stale_node() -> tuple[str, list[str]]:
    """Undo a real node that was killed without its teardown (a killed test run, a restarted machine): the
    lock file still names its cluster's folder but nobody holds the lock (it lived in containerd). Its
    surviving node components are stopped, its traces undone from its state file's record (the sysctls
    as they were before it, the folders that did not exist then), and the record dropped from that state
    file; the rest of that cluster, if any of it still runs, is left alone. Returns the folder ("" when
    there was nothing to undo) and what was undone."""
    with real_node.stale_lock() as folder:
        if not folder:
            return "", []
        workdir = Path(folder)
        st = load_state(workdir) if workdir.is_dir() else None
        # without its record: the bridge, the tables, mounts and shims still go, but no folder that exists
        # now is taken for the node's and no sysctl is guessed at
        rec = (st or {}).get("node_record") or {"undo": {}, "dirs_before": traces.snapshot()["dirs"]}
        pids: dict[str, int] = (st or {}).get("pids", {})
        argv0: dict[str, str] = (st or {}).get("argv", {})

        def stop(name: str) -> None:
            if name in pids:
                stop_pid(pids[name], argv0.get(name, ""), 5.0)

        done = real_node.teardown(workdir, rec, None, stop)
        if st is not None and st.get("node_record"):
            st["node_record"] = None
            st["node"] = None
            write(workdir, st)
        return folder, done
