"""An upgrade in place: objects that the operator at fe501e0 wrote (its status keys, its children, its revision
names, a train job in the middle of its stages, a serving rollout in mid-flight) are taken over by this one with
no rollout of its own and nothing lost. The old operator is the real one: its package is taken from the
repository's history (`git archive`) and run as its own process against the real control plane; then this one
runs in-process.

fe501e0 named a serving revision without the server image (the image entered the hash after it), so the
takeover relies on planning/adoption.py. Neither operator pins images by digest here: a pin configured with the
upgrade is a new revision, and a rollout, by design."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner
from prometheus_client import REGISTRY

from .conftest import REPO, Cluster, eventually, get, sdep
from .test_trainjob_controller import OFFLINE_STAGES, jobs, slow_offline

pytestmark = pytest.mark.cluster
OLD = "fe501e0"
LABEL = "speculators.dev/upgrade-test"


@pytest.fixture(scope="module")
def old_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator package as it was at fe501e0, from the repository's own history."""
    found = subprocess.run(["git", "-C", str(REPO), "archive", OLD, "operator"], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"the repository's history does not hold {OLD} (a shallow clone?): {found.stderr.decode()[:200]}")
    out = tmp_path_factory.mktemp("fe501e0")
    with tarfile.open(fileobj=io.BytesIO(found.stdout)) as archive:
        archive.extractall(out, filter="data")
    return out / "operator"


@contextmanager
def old_operator(cluster: Cluster, namespace: str, package: Path, log: Path) -> Iterator[None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATOR_")}
    env.update(KUBECONFIG=str(cluster.kubeconfig), PYTHONPATH=str(package))
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kopf", *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(30)


def passes(kind: str) -> float:
    return sum(
        s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == "speculator_passes_total" and s.labels.get("kind") == kind
    )


def test_objects_the_operator_at_fe501e0_wrote_are_taken_over_without_a_rollout(
    cluster: Cluster,
    operator_crds: list[str],
    store: dict[str, str],
    namespace: str,
    creds: str,
    workspace: Any,
    old_package: Path,
    tmp_path: Path,
) -> None:
    workspace("midway-workspace")
    with old_operator(cluster, namespace, old_package, tmp_path / "old-operator.log"):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("served", store, "good", creds))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=slow_offline("midway", store, creds, "4s"))
        # a rollout in mid-flight: its pods have no node until the test labels one
        rolling = sdep("rolling", store, "good", creds, nodeSelector={LABEL: namespace})
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=rolling)
        try:
            cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/served", "--timeout=120s")
            eventually(lambda: _has(jobs(cluster, namespace, "midway"), "prepare"), timeout=120, interval=0.2)
            eventually(lambda: _rolling_out(get(cluster, namespace, "sdep/rolling")), timeout=60)
        except Exception:
            print((tmp_path / "old-operator.log").read_text()[-4000:])
            raise
    before = get(cluster, namespace, "sdep/served")
    child0 = get(cluster, namespace, "deployment/served")
    rolling0, rolling_child0 = get(cluster, namespace, "sdep/rolling"), get(cluster, namespace, "deployment/rolling")
    jobs0 = {stage: job["metadata"]["uid"] for stage, job in jobs(cluster, namespace, "midway").items()}

    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    passes0 = passes("SpeculatorDeployment")
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    with KopfRunner(args, timeout=60) as runner:
        # the train job goes on from the stage it was in, the deployment gets its first pass from this operator
        cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "stj/midway",
                        "--timeout=240s", timeout=260)  # fmt: skip
        eventually(lambda: _more(passes("SpeculatorDeployment"), passes0 + 1), timeout=60)
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/served", "--timeout=60s")
        # the rollout the old operator started finishes under this one, as it was
        try:
            cluster.kubectl("label", "nodes", "-l", "type=kwok", f"{LABEL}={namespace}")
            cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/rolling", "--timeout=120s")
        finally:
            cluster.kubectl("label", "nodes", "-l", "type=kwok", f"{LABEL}-")
    assert runner.exception is None, runner.exception
    rolling1, rolling_child1 = get(cluster, namespace, "sdep/rolling"), get(cluster, namespace, "deployment/rolling")
    assert rolling1["status"]["revision"] == rolling0["status"]["revision"]
    assert rolling_child1["spec"]["template"] == rolling_child0["spec"]["template"]
    assert rolling_child1["metadata"]["generation"] == rolling_child0["metadata"]["generation"]

    after = get(cluster, namespace, "sdep/served")
    child1 = get(cluster, namespace, "deployment/served")
    # no rollout: the same revision name, the same pod template, the child's generation where it was
    assert after["status"]["revision"] == before["status"]["revision"]
    assert child1["spec"]["template"] == child0["spec"]["template"]
    assert child1["metadata"]["generation"] == child0["metadata"]["generation"]
    assert after["status"]["observedGeneration"] == after["metadata"]["generation"]
    # status.economics is priced anew, not recorded: this operator prices a draft with no measurement by its device
    # class prior, where the old one took the parameter ratio (docs/concepts/economics.md), and says so in its source
    repriced = ("conditions", "observedGeneration", "economics")
    kept = {k: v for k, v in before["status"].items() if k not in repriced}
    # nothing else the old operator recorded is lost or changed (this one may say more)
    assert _within(kept, {k: after["status"].get(k) for k in kept}), (kept, after["status"])
    assert before["status"]["economics"].get("source", "parameters") == "parameters"  # fe501e0 named none
    assert after["status"]["economics"]["source"] == "prior"
    # the train job: the stages the old operator started were not started again, every stage ran once
    midway = get(cluster, namespace, "stj/midway")["status"]
    assert [(s["name"], s["phase"]) for s in midway["stages"]] == [(s, "Succeeded") for s in OFFLINE_STAGES]
    jobs1 = jobs(cluster, namespace, "midway")
    assert sorted(jobs1) == sorted(OFFLINE_STAGES)
    assert {stage: jobs1[stage]["metadata"]["uid"] for stage in jobs0} == jobs0


def _has(found: dict[str, Any], stage: str) -> None:
    assert stage in found, sorted(found)


def _rolling_out(obj: dict[str, Any]) -> None:
    """Its revision applied, its pods not ready (a stuck pod may make the old operator say Degraded)."""
    status = obj.get("status") or {}
    assert status.get("revision"), status
    assert status.get("phase") in ("Deploying", "Degraded"), status


def _more(now: float, before: float) -> None:
    assert now > before, f"no pass yet ({now})"


def _within(old: Any, new: Any) -> bool:
    """Whether `new` holds every value `old` holds (objects may have gained fields)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _within(v, new[k]) for k, v in old.items())
    return bool(old == new)
