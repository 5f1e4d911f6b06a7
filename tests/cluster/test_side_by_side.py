"""Two releases' operators (`speculator-operator run --leader-elect`, as the chart runs them) against the real API
server: a standby answers the probe the chart's readinessProbe asks; beside another release's live operator on
disjoint namespaces an operator runs its controllers; on the same objects the one the rule does not give them
refuses to start (exit 5, naming the other Lease) and hands its own Lease back (runtime/peers.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from speculator_operator.runtime.peers import EXIT_OVERLAP, LEASE_LABEL, SCOPE_ANNOTATION
from speculator_operator.runtime.settings import PULL_SECRETS_ENV

from .conftest import OPERATOR, Cluster, eventually, get, operator_script, sdep

pytestmark = pytest.mark.cluster


def micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def other_release(cluster: Cluster, namespace: str, name: str, scope: str, holder: str = "other-pod_abc") -> None:
    """The Lease of another release's live operator, as its Elector writes it (held, just renewed)."""
    now = datetime.now(UTC)
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "labels": {LEASE_LABEL: "true"},
                     "annotations": {SCOPE_ANNOTATION: scope}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": micro(now - timedelta(hours=1)),
                 "renewTime": micro(now), "leaseTransitions": 0},
    }  # fmt: skip
    client.CoordinationV1Api(cluster.api).create_namespaced_lease(namespace, body)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Operator:
    def __init__(
        self, cluster: Cluster, log: Path, lease_ns: str, lease: str, *scope: str, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.log_path = log
        self._log = log.open("wb")
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), **(env or {})}
        env.pop("SPECULATOR_METRICS_PORT", None)
        argv = [str(OPERATOR), "run", "--leader-elect", "--lease-namespace", lease_ns, "--lease-name", lease,
                "--identity", f"{lease}-pod_1", f"--liveness=http://127.0.0.1:{self.port}/healthz", *scope]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(60)


@pytest.fixture
def operators() -> Iterator[list[Operator]]:
    operator_script()
    started: list[Operator] = []
    yield started
    for op in started:
        if op.proc.poll() is None:
            op.proc.kill()
            op.wait(30)


@pytest.fixture
def two_namespaces(cluster: Cluster, namespace: str) -> Iterator[tuple[str, str]]:
    second = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", second)
    yield namespace, second
    cluster.kubectl("delete", "namespace", second, "--wait=false", check=False)


def holder(cluster: Cluster, namespace: str, lease: str) -> str | None:
    """The Lease's holder ("" when handed back), None when there is no such Lease."""
    out = cluster.kubectl("get", "-n", namespace, f"lease/{lease}", "-o", "jsonpath={.spec.holderIdentity}",
                          check=False)  # fmt: skip
    if out.returncode != 0:
        assert "NotFound" in out.stderr, out.stderr
        return None
    return out.stdout.strip()


def test_a_standby_answers_the_readiness_probe(
    cluster: Cluster, operator_crds: list[str], namespace: str, operators: list[Operator], tmp_path: Path
) -> None:
    # this release's Lease is held by its other replica: this one waits as a standby
    other_release(cluster, namespace, "so-speculator-operator", namespace, holder="so-speculator-operator-pod_0")
    standby = Operator(cluster, tmp_path / "standby.log", namespace, "so-speculator-operator", "-n", namespace)
    operators.append(standby)

    def ready() -> bytes:
        assert standby.proc.poll() is None, standby.log()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{standby.port}/healthz", timeout=5) as resp:
                assert resp.status == 200
                return bytes(resp.read())
        except (urllib.error.URLError, ConnectionError) as exc:
            raise AssertionError(f"not answering yet: {exc}") from None

    assert b"standby" in eventually(ready, timeout=60)
    assert holder(cluster, namespace, "so-speculator-operator") == "so-speculator-operator-pod_0"
    assert standby.stop() == 0


def test_disjoint_releases_run_side_by_side(
    cluster: Cluster,
    operator_crds: list[str],
    two_namespaces: tuple[str, str],
    operators: list[Operator],
    store: dict[str, str],
    creds: str,
    tmp_path: Path,
) -> None:
    ours, theirs = two_namespaces
    other_release(cluster, ours, "team-a-speculator-operator", theirs)  # watches the other namespace only
    # with the chart's setting for imagePullSecrets, read once at start
    op = Operator(cluster, tmp_path / "b.log", ours, "team-b-speculator-operator", "-n", ours,
                  env={PULL_SECRETS_ENV: "regcred"})  # fmt: skip
    operators.append(op)
    # it runs its controllers: a resource in its namespace gets its children, its pods pulled with the Secret
    cluster.kubectl("apply", "-n", ours, "-f", "-", input=sdep("mine", store, "good", creds, replicas=1))

    def reconciled() -> dict[str, Any]:
        assert op.proc.poll() is None, op.log()
        out = cluster.kubectl("get", "-n", ours, "deployment/mine", "-o", "json", check=False)
        assert out.returncode == 0, f"no Deployment yet: {out.stderr}"
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    served = eventually(reconciled, timeout=90)
    assert served["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    lease = get(cluster, ours, "lease/team-b-speculator-operator")
    assert lease["metadata"]["labels"][LEASE_LABEL] == "true"
    assert lease["metadata"]["annotations"][SCOPE_ANNOTATION] == ours  # what it watches, for the next release
    assert op.stop() == 0


@pytest.mark.parametrize("scope", ["named", "all"])
def test_a_release_on_objects_another_one_watches_refuses_to_start(
    cluster: Cluster,
    operator_crds: list[str],
    two_namespaces: tuple[str, str],
    operators: list[Operator],
    tmp_path: Path,
    scope: str,
) -> None:
    ours, theirs = two_namespaces
    # a live release, older, watching both namespaces; the new one: one of them, or every namespace
    other_release(cluster, theirs, "team-a-speculator-operator", f"{ours},{theirs}")
    flags = ["-n", ours] if scope == "named" else ["--all-namespaces"]
    op = Operator(cluster, tmp_path / "b.log", theirs, "team-b-speculator-operator", *flags)
    operators.append(op)
    assert op.wait(90) == EXIT_OVERLAP, op.log()
    assert "refusing to start" in op.log()
    # (an all-namespaces one also names any other live release it sees, an earlier test's among them)
    assert f"the operator of Lease {theirs}/team-a-speculator-operator watches namespaces" in op.log()
    # refused before its election: it holds no Lease (nor answers a readiness probe)
    assert holder(cluster, theirs, "team-b-speculator-operator") in (None, "")
    assert holder(cluster, theirs, "team-a-speculator-operator") == "other-pod_abc"  # the other one untouched
