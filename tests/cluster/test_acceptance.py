"""Live acceptance on the real control plane, with scripted vLLM metrics: the serving pods run on a kwok node
whose pod range lies in 127.0.0.0/8, and a stand-in on this machine answers each pod's address with
vLLM-shaped counters that grow on every scrape as the test scripts them (agreeing, disagreeing, broken).
Real vLLM's own numbers are checked on the real node (test_node.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kopf.testing import KopfRunner
from prometheus_client import REGISTRY

from .conftest import Cluster, eventually, get, sdep
from .standin import STEP, serving, stand_ins, standin_node  # noqa: F401  (standin_node: a fixture)

pytestmark = pytest.mark.cluster


def _effective(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    conditions = get(cluster, namespace, f"sdep/{name}")["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "SpeculationEffective"), {})


def _warnings(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    events = get(cluster, namespace, "events")["items"]
    return [e for e in events if e.get("reason") == reason and e.get("type") == "Warning"]


@pytest.mark.usefixtures("standin_node")
def test_acceptance_reaches_status_and_speculation_effective_flips_once(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=sdep("flip", store, "good", creds, replicas=1, **serving())
    )
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/flip", "--timeout=120s")
    status = get(cluster, namespace, "sdep/flip")["status"]
    k = status["numSpeculativeTokens"]
    assert status["economics"]["costRatio"] > 0  # the pair is priced: the verifier's config was read
    fakes = stand_ins(cluster, namespace, "flip", k, 1)
    try:
        # a draft the verifier always agrees with
        def effective() -> dict[str, Any]:
            cond = _effective(cluster, namespace, "flip")
            assert (cond.get("status"), cond.get("reason")) == ("True", "AboveBreakEven"), cond
            return cond

        eventually(effective, timeout=60)
        acc = get(cluster, namespace, "sdep/flip")["status"]["acceptance"]
        assert acc["rate"] == 1.0
        assert acc["alpha"] == 1.0
        assert acc["meanAcceptedLength"] == k + 1
        assert acc["perPosition"] == [1.0] * k
        assert acc["percent"] == "100.0%"
        assert acc["revision"] == status["revision"]
        assert acc["recommendedK"] == status["economics"]["maxK"]
        assert acc["predictedSpeedup"] > 1
        assert acc["load"]["requestsRunning"] == 3.0
        labels = {"namespace": namespace, "name": "flip"}
        assert REGISTRY.get_sample_value("speculator_acceptance_rate", labels) == 1.0  # the operator's own metrics
        printed = cluster.kubectl("get", "-n", namespace, "speculators").stdout
        assert "100.0%" in printed  # the printer column

        # the draft stops agreeing: once the window has drained, speculation is judged not to pay
        for s in fakes.values():
            s.mode = "disagree"

        def below() -> dict[str, Any]:
            cond = _effective(cluster, namespace, "flip")
            assert (cond.get("status"), cond.get("reason")) == ("False", "BelowBreakEven"), cond
            return cond

        cond = eventually(below, timeout=120)
        assert "break-even α*" in cond["message"]
        acc = get(cluster, namespace, "sdep/flip")["status"]["acceptance"]
        assert acc["predictedSpeedup"] < 1
        assert acc["alpha"] < acc["breakEvenAlpha"]

        # and once nothing agreeing is left in the window, the best K is none at all
        def none_accepted() -> None:
            acc = get(cluster, namespace, "sdep/flip")["status"]["acceptance"]
            assert (acc["rate"], acc["recommendedK"]) == (0.0, 0), acc

        eventually(none_accepted, timeout=60)
        eventually(lambda: _assert_len(_warnings(cluster, namespace, "BelowBreakEven"), 1), timeout=30)
        # it stays False for five more scrapes: no second event (one per transition)
        scraped = fakes[next(iter(fakes))]
        seen = scraped.drafts
        eventually(lambda: _assert(scraped.drafts >= seen + 5 * STEP, "fewer than 5 more scrapes"), timeout=30)
        assert _effective(cluster, namespace, "flip")["status"] == "False"
        warnings = _warnings(cluster, namespace, "BelowBreakEven")
        assert len(warnings) == 1
        assert warnings[0].get("count", 1) == 1
    finally:
        for s in fakes.values():
            s.close()


def _assert_len(items: list[Any], n: int) -> None:
    assert len(items) == n, items


def _assert(condition: bool, message: str) -> None:
    assert condition, message


@pytest.mark.usefixtures("standin_node")
@pytest.mark.parametrize(
    ("mode", "reason"),
    [("garbage", "Unparseable"), ("error", "HTTPError"), ("slow", "Timeout"), ("huge", "TooLarge")],
)
def test_a_broken_pod_is_named_and_the_others_still_count(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    mode: str,
    reason: str,
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("pair", store, "good", creds, **serving()))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/pair", "--timeout=120s")
    k = get(cluster, namespace, "sdep/pair")["status"]["numSpeculativeTokens"]
    fakes = stand_ins(cluster, namespace, "pair", k, 2)
    bad = sorted(fakes)[1]
    try:
        eventually(lambda: _assert_counted(cluster, namespace, 2, None), timeout=60)
        fakes[bad].mode = mode
        acc = eventually(lambda: _assert_counted(cluster, namespace, 1, (bad, reason)), timeout=60)
        assert acc["drafts"] > 0  # the good pod's drafts still count
        assert acc["rate"] == 1.0
        # bounded: the scrapes go on at their pace (observedAt moves with the good pod's numbers)
        fakes[bad].mode = "agree"
        eventually(lambda: _assert_counted(cluster, namespace, 2, None), timeout=60)
    finally:
        for s in fakes.values():
            s.close()


def _assert_counted(cluster: Cluster, namespace: str, counted: int, failing: tuple[str, str] | None) -> dict[str, Any]:
    acc = get(cluster, namespace, "sdep/pair")["status"].get("acceptance") or {}
    pods = acc.get("pods") or {}
    assert pods.get("counted") == counted, acc
    listed = [(f["pod"], f["reason"]) for f in pods.get("failing") or []]
    out = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide")
    assert listed == ([failing] if failing else []), (acc, out.stdout)
    return acc


@pytest.mark.usefixtures("standin_node")
def test_a_restarted_vllm_resets_its_counters_and_is_still_counted(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("pair", store, "good", creds, **serving()))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/pair", "--timeout=120s")
    k = get(cluster, namespace, "sdep/pair")["status"]["numSpeculativeTokens"]
    fakes = stand_ins(cluster, namespace, "pair", k, 2)
    try:
        eventually(lambda: _assert_counted(cluster, namespace, 2, None), timeout=60)
        first = sorted(fakes)[0]
        # well past its first reading: a restart must bring the counter below what the operator last saw
        eventually(lambda: _assert(fakes[first].drafts >= 5 * STEP, "fewer than 5 scrapes so far"), timeout=30)
        fakes[first].mode = "backwards"

        def reset_seen() -> dict[str, Any]:
            acc = _assert_counted(cluster, namespace, 2, None)
            assert (acc["pods"].get("counterResets") or 0) >= 1, acc
            return acc

        acc = eventually(reset_seen, timeout=60)
        assert acc["rate"] == 1.0  # the reset is not read as negative acceptance
    finally:
        for s in fakes.values():
            s.close()
