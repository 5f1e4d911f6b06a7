"""Supervised processes of the local cluster: each in its own process group with its own log; started and
waited for until ready, failing fast (naming the component, with its log tail) when one exits, and
retried on another port when one lost its port to another process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"
PORT_RETRIES = 3
PORT_IN_USE_MARKERS = ("address already in use", "bind: address in use")


class ComponentError(RuntimeError):
    """A component of the local cluster did not start; names it and carries its log tail."""

    def __init__(self, component: str, problem: str, log_tail: str = "") -> None:
        self.component = component
        self.problem = problem
        self.log_tail = log_tail
        text = f"{component}: {problem}"
        if log_tail:
            text += f"\n--- last lines of the {component} log ---\n{log_tail}"
        super().__init__(text)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-64_000:]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def http_get(url: str, ctx: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:  # noqa: S310 (local addresses only)
        return str(resp.read().decode())


class Process:
    """One supervised component: its own process group, its own log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        with log.open("ab") as out:
            out.write(f"\n=== {' '.join(argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                pass_fds=pass_fds,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> int | None:
        return self.popen.poll()

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        else:
            # the leader is gone, but a child it left behind may not be
            signal_group(self.popen.pid, signal.SIGKILL)


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_ours(pid: int, argv0: str) -> bool:
    """Guard against a recycled pid: the process must still run the binary we started."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return bool(argv0) and cmdline == argv0


def stop_pid(pid: int, argv0: str, grace: float = 10.0) -> bool:
    """Stop a recorded process group (another process started it); False if it was not running."""
    if not (is_ours(pid, argv0) and alive(pid)):
        return False
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        signal_group(pid, signal.SIGKILL)
    return True


class Supervisor:
    """Starts components in `workdir` from the binaries in `bin_dir` and keeps track of them."""

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        timeout: float = 120.0,
        log: Callable[[str], None] | None = None,
        port_picker: Callable[[], int] = free_port,
    ) -> None:
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.port_picker = port_picker
        self.processes: dict[str, Process] = {}
        self.ports: dict[str, int] = {}
        self.durations: dict[str, float] = {}
        # what each component was started with, to start it again in place (same ports, same flags)
        self.launched: dict[str, tuple[list[str], Callable[[], bool], dict[str, str] | None, Sequence[int]]] = {}

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def port(self, name: str) -> int:
        self.ports[name] = self.port_picker()
        return self.ports[name]

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def launch(
        self,
        name: str,
        make_argv: Callable[[], list[str]],
        ready: Callable[[], bool],
        env: dict[str, str] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> Process:
        """Start `name` and wait until `ready()`; retry on another port if it lost its port."""
        log = self.log_path(name)
        t0 = time.monotonic()
        for attempt in range(1, PORT_RETRIES + 1):
            argv = make_argv()
            proc = Process(name, argv, log, env, pass_fds)
            self.processes[name] = proc
            outcome = self.wait(name, proc, ready)
            if outcome == "ready":
                self.launched[name] = (argv, ready, env, pass_fds)
                self.durations[name] = time.monotonic() - t0
                self.say(f"local-cluster: {name} ready in {self.durations[name]:.1f} s")
                return proc
            text = tail(log, 60).lower()
            if any(marker in text for marker in PORT_IN_USE_MARKERS) and attempt < PORT_RETRIES:
                self.say(f"local-cluster: {name} lost its port to another process; retrying on a new one")
                proc.stop()
                continue
            raise ComponentError(name, f"exited with code {proc.exited()} while starting", tail(log))
        raise AssertionError("unreachable")

    def wait(self, name: str, proc: Process, ready: Callable[[], bool]) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if proc.exited() is not None:
                return "exited"
            try:
                if ready():
                    return "ready"
            except (OSError, ValueError, ssl.SSLError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise ComponentError(name, f"not ready within {self.timeout:.0f} s", tail(proc.log))

    def stop_component(self, name: str) -> None:
        """Stop one component and keep what it was started with (a fault a test injects)."""
        if name not in self.launched:
            raise KeyError(f"{name} was not started by this supervisor")
        proc = self.processes.get(name)
        if proc is not None:
            proc.stop()
        self.say(f"local-cluster: {name} stopped")

    def start_component(self, name: str) -> Process:
        """Start a stopped component again in place: the same command line, so the same ports and data."""
        argv, ready, env, pass_fds = self.launched[name]
        t0 = time.monotonic()
        proc = Process(name, argv, self.log_path(name), env, pass_fds)
        self.processes[name] = proc
        if self.wait(name, proc, ready) != "ready":
            raise ComponentError(name, f"exited with code {proc.exited()} while starting again", tail(proc.log))
        self.say(f"local-cluster: {name} started again in {time.monotonic() - t0:.1f} s")
        return proc

    def restart_component(self, name: str) -> Process:
        self.stop_component(name)
        return self.start_component(name)

    def check_running(self) -> None:
        """Fail naming the first component that has exited."""
        for name, proc in self.processes.items():
            if proc.exited() is not None:
                raise ComponentError(name, f"exited with code {proc.exited()}", tail(proc.log))

    def stop_all(self) -> None:
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        self.processes.clear()
