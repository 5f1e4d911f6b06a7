"""Two operator processes (`speculator-operator run --leader-elect`, as the chart runs them) against the real
API server: one holds the Lease and runs the controllers, the other waits. Killing the holder hands the
work to the standby within the lease's duration, with no child made twice and no status write lost to a
conflict (the API server's audit log); a clean stop hands the Lease back at once; a holder that finds the
Lease taken stops its controllers and exits 3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import pytest

from .conftest import OPERATOR, Cluster, eventually, get, operator_script, sdep

pytestmark = pytest.mark.cluster


class Candidate:
    def __init__(self, cluster: Cluster, namespace: str, identity: str, log_dir: Path) -> None:
        self.identity = identity
        self.log_path = log_dir / f"{identity}.log"
        self._log: IO[bytes] = self.log_path.open("wb")
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        env.pop("SPECULATOR_METRICS_PORT", None)
        argv = [str(OPERATOR), "run", "--verbose", "--leader-elect", "--namespace", namespace, "--lease-namespace",
                namespace, "--identity", identity]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self._log.close()
        return rc


@pytest.fixture
def candidates() -> Iterator[dict[str, Candidate]]:
    operator_script()
    started: dict[str, Candidate] = {}
    yield started  # the test adds what it starts; whatever still runs at the end is killed
    for cand in started.values():
        if cand.proc.poll() is None:
            cand.stop(signal.SIGKILL)


def lease(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get(cluster, namespace, "lease/speculator-operator")


def holder(cluster: Cluster, namespace: str) -> str:
    out = cluster.kubectl("get", "lease", "speculator-operator", "-n", namespace, "-o",
                          "jsonpath={.spec.holderIdentity}", check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def lost_writes(audit_log: Path, namespace: str, since: str) -> list[str]:
    """Writes to our resources the API server refused as conflicting (409: a stale resourceVersion) and that
    no later write to the same object and subresource made good, since `since`. A write that carries a
    resourceVersion may be refused and is retried by design; one never made good is a lost one."""
    events = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef", {})
        if (
            event.get("stage") == "ResponseComplete"
            and event["requestReceivedTimestamp"] >= since
            and ref.get("namespace") == namespace
            and ref.get("apiGroup") == "speculators.dev"
            and event["verb"] in ("patch", "update")
        ):
            key = f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')}/{ref.get('name')}"
            events.append((event["requestReceivedTimestamp"], key, event.get("responseStatus", {}).get("code")))
    events.sort()
    return [
        key
        for i, (_, key, code) in enumerate(events)
        if code == 409 and not any(k == key and c == 200 for _, k, c in events[i + 1 :])
    ]


def children(cluster: Cluster, namespace: str) -> dict[str, str]:
    """name -> uid of every Deployment and Service in the namespace."""
    items = get(cluster, namespace, "deployments,services")["items"]
    return {f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["uid"] for i in items}


def test_killing_the_holder_hands_the_work_to_the_standby_once(
    cluster: Cluster, operator_crds: list[str], store: dict[str, str], namespace: str, creds: str,
    candidates: dict[str, Candidate], tmp_path: Path,
) -> None:  # fmt: skip
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for identity in ("alpha", "beta"):
        candidates[identity] = Candidate(cluster, namespace, identity, tmp_path)
    active_name = eventually(lambda: _held(cluster, namespace), timeout=90)
    active = candidates[active_name]
    standby = candidates["beta" if active_name == "alpha" else "alpha"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("one", store, "good", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/one", "--timeout=120s")
    first_revision = get(cluster, namespace, "sdep/one")["status"]["revision"]
    before = children(cluster, namespace)
    # the standby ran no controller: it only watches the Lease (once it has started: under load it may still
    # be importing when the holder has already made the resource Ready)
    eventually(lambda: _standing_by(standby, namespace), timeout=60)
    assert f"standby: Lease {namespace}/speculator-operator is held by {active_name}" in standby.log()
    assert "Handler" not in standby.log(), standby.log()[-2000:]
    assert "Handler" in active.log()

    active.stop(signal.SIGKILL)  # no clean shutdown: the Lease is not handed back
    # while nobody runs the controllers: a change to the running one and a new one
    cluster.kubectl("patch", "-n", namespace, "sdep/one", "--type=merge", "-p",
                    json.dumps({"spec": {"serving": {"extraArgs": ["--enforce-eager"]}}}))  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("two", store, "good", creds))
    assert eventually(lambda: _held(cluster, namespace, standby.identity), timeout=90) == standby.identity
    assert f"acquired by {standby.identity}" in standby.log()

    def rolled() -> None:
        status = get(cluster, namespace, "sdep/one").get("status") or {}
        assert status.get("revision") not in (None, first_revision), status
        assert status.get("phase") == "Ready", status

    eventually(rolled, timeout=180)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/two", "--timeout=180s")
    after = children(cluster, namespace)
    # the running one's children are the same objects, changed in place; the new one has its own, once
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(k for k in after if k not in before) == ["Deployment/two", "Service/two"]
    if cluster.local is not None and cluster.local.audit_log is not None:
        assert lost_writes(cluster.local.audit_log, namespace, since) == []
    assert int(lease(cluster, namespace)["spec"]["leaseTransitions"]) == 1

    # a clean stop hands the Lease back: a new candidate takes it without waiting out the duration
    gamma = Candidate(cluster, namespace, "gamma", tmp_path)
    candidates["gamma"] = gamma
    eventually(lambda: _standing_by(gamma, namespace), timeout=60)
    assert standby.stop(signal.SIGTERM) == 0
    assert f"released by {standby.identity}" in standby.log()
    assert eventually(lambda: _held(cluster, namespace, "gamma"), timeout=30) == "gamma"


def test_a_holder_that_finds_the_lease_taken_stops_and_exits_3(
    cluster: Cluster, operator_crds: list[str], namespace: str, candidates: dict[str, Candidate], tmp_path: Path
) -> None:
    only = Candidate(cluster, namespace, "only", tmp_path)
    candidates["only"] = only
    eventually(lambda: _held(cluster, namespace, "only"), timeout=90)
    cluster.kubectl("patch", "lease", "speculator-operator", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"holderIdentity": "intruder"}}))  # fmt: skip
    assert only.proc.wait(60) == 3
    log = only.log()
    assert f"Lease {namespace}/speculator-operator lost (now held by 'intruder')" in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]


def _held(cluster: Cluster, namespace: str, by: str | None = None) -> str:
    who = holder(cluster, namespace)
    assert who, "nobody holds the Lease yet"
    if by is not None:
        assert who == by, f"held by {who!r}, not {by!r}"
    return who


def _standing_by(cand: Candidate, namespace: str) -> None:
    assert f"standby: Lease {namespace}/speculator-operator is held by" in cand.log(), cand.log()[-1000:]
