"""Tuning on the real control plane, with scripted vLLM metrics (standin.py): Recommend recommends and rolls
nothing; Auto rolls exactly once for sustained evidence, never for evidence shorter than
minIntervalSeconds nor for evidence swinging between two K's, and an operator restart rolls nothing;
allowDisable switches speculation off and a probe revision measures it again.

Each test runs its own operator (scoped to its namespace), so that one can be restarted. Rollouts are
counted by the child Deployment's generation: every new pod template moves it by one."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.domain.economics import best_k, speedup

from .conftest import Cluster, eventually, get, sdep
from .standin import StandIn, standin_node  # noqa: F401  (standin_node: a fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("operator_crds", "standin_node")]


@contextmanager
def operator_in(cluster: Cluster, namespace: str) -> Iterator[KopfRunner]:
    args = ["run", "--standalone", "--namespace", namespace, "-m", "speculator_operator.controllers"]
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)  # the operator's login reads it (not only other tests)
    with KopfRunner(args, timeout=60) as runner:
        yield runner


def tuning(**fields: Any) -> dict[str, Any]:
    return {
        "replicas": 1,
        "nodeSelector": {"speculators.dev/standin": "true"},
        "tuning": {"minSamples": 100, "windowSeconds": 30, **fields},
    }


def status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, namespace, f"sdep/{name}")["status"]  # type: ignore[no-any-return]


def rollouts(cluster: Cluster, namespace: str, name: str) -> int:
    """Pod templates the child Deployment has had after its first: each tuned revision is one."""
    return int(get(cluster, namespace, f"deployment/{name}")["metadata"]["generation"]) - 1


def served_config(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    args = get(cluster, namespace, f"deployment/{name}")["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])  # type: ignore[no-any-return]


def events(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in get(cluster, namespace, "events")["items"] if e.get("reason") == reason]


def effective(cluster: Cluster, namespace: str, name: str) -> tuple[str, str]:
    conds = status(cluster, namespace, name).get("conditions") or []
    c = next((c for c in conds if c["type"] == "SpeculationEffective"), {})
    return c.get("status", ""), c.get("reason", "")


def fakes_for(cluster: Cluster, namespace: str, name: str, k: int, mode: str, alpha: float = 1.0) -> list[StandIn]:
    """Stand-ins at the addresses of the served revision's pods (once the old revision's are gone)."""

    def pods() -> list[dict[str, Any]]:
        revision = status(cluster, namespace, name)["revision"]
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"speculators.dev/deployment={name}", "-o", "json")
        items = json.loads(out.stdout)["items"]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        mine = [p for p in live if p["metadata"]["labels"].get("speculators.dev/revision") == revision]
        assert len(live) == len(mine) == 1, [p["metadata"]["name"] for p in items]
        assert mine[0]["status"].get("podIP", "").startswith("127.1.0."), mine[0]["status"]
        return mine

    made = [StandIn(p["status"]["podIP"], k) for p in eventually(pods, timeout=90)]
    for f in made:
        f.mode, f.alpha = mode, alpha
    return made


def close(fakes: list[StandIn]) -> None:
    for f in fakes:
        f.close()


def scrapes(fakes: list[StandIn], n: int) -> None:
    """Wait until every stand-in has answered `n` more scrapes (the operator scrapes each second here)."""
    marks = [f.scrapes for f in fakes]

    def done() -> None:
        for f, mark in zip(fakes, marks, strict=True):
            assert f.scrapes - mark >= n, "fewer scrapes than asked for"

    eventually(done, timeout=30 + 3 * n)


def low_alpha(cost_ratio: float, k: int) -> float:
    """An α at which K=1 beats the checkpoint's K by well over the 5 % hysteresis."""
    for alpha in (0.3, 0.35, 0.4, 0.45):
        if best_k(alpha, cost_ratio, "eagle3", k)[0] == 1 and speedup(alpha, 1, cost_ratio) > 1.1 * speedup(
            alpha, k, cost_ratio
        ):
            return alpha
    raise AssertionError(f"no α makes K=1 clearly best at cost ratio {cost_ratio}")


def test_recommend_writes_the_best_k_and_rolls_nothing(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str
) -> None:
    with operator_in(cluster, namespace):
        body = sdep("rec", store, "good", creds, **tuning(mode="Recommend"))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body)
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/rec", "--timeout=120s")
        st = status(cluster, namespace, "rec")
        k, alpha = st["numSpeculativeTokens"], low_alpha(st["economics"]["costRatio"], st["numSpeculativeTokens"])
        fakes = fakes_for(cluster, namespace, "rec", k, "alpha", alpha)
        try:

            def recommended() -> dict[str, Any]:
                acc = status(cluster, namespace, "rec").get("acceptance") or {}
                assert acc.get("recommendedK") == 1, acc
                assert abs(acc["alpha"] - alpha) < 0.01, acc
                return acc

            eventually(recommended, timeout=60)
            scrapes(fakes, 10)
            st = status(cluster, namespace, "rec")
            assert rollouts(cluster, namespace, "rec") == 0
            assert st["numSpeculativeTokens"] == k
            assert "tuning" not in st
        finally:
            close(fakes)


def test_auto_rolls_once_for_sustained_evidence_and_never_flaps(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str
) -> None:
    with operator_in(cluster, namespace):
        body = sdep("auto", store, "good", creds, **tuning(mode="Auto", minIntervalSeconds=15))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body)
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/auto", "--timeout=120s")
        st = status(cluster, namespace, "auto")
        k, alpha = st["numSpeculativeTokens"], low_alpha(st["economics"]["costRatio"], st["numSpeculativeTokens"])
        fakes = fakes_for(cluster, namespace, "auto", k, "agree")
        try:
            eventually(lambda: _is(effective(cluster, namespace, "auto"), ("True", "AboveBreakEven")), timeout=60)

            # evidence for K=1 that lasts five scrapes (a third of minIntervalSeconds), then the served K is
            # right again; twice over (a flap needs only one such turn back; the bench's sizes are not needed
            # here). Each phase drafts 20x more than the last, so that the 30 s window turns with it at once.
            for phase in range(4):
                for f in fakes:
                    f.step *= 20
                    f.mode, f.alpha = ("alpha", alpha) if phase % 2 == 0 else ("agree", 1.0)
                if phase % 2 == 0:
                    eventually(lambda: _is(_pending(cluster, namespace), 1), timeout=20)
                else:
                    eventually(lambda: _is(_pending(cluster, namespace), None), timeout=20)
                scrapes(fakes, 5)
            assert rollouts(cluster, namespace, "auto") == 0
            assert events(cluster, namespace, "TunedK") == []

            # sustained evidence: exactly one rollout, to K=1 and its per-batch-size schedule
            for f in fakes:
                f.step *= 20
                f.mode, f.alpha = "alpha", alpha

            def tuned() -> dict[str, Any]:
                st = status(cluster, namespace, "auto")
                assert st["numSpeculativeTokens"] == 1, st.get("tuning")
                return st

            st = eventually(tuned, timeout=60)
            assert rollouts(cluster, namespace, "auto") == 1
            assert st["tuning"]["k"] == 1
            assert st["tuning"]["rollouts"] == 1
            config = served_config(cluster, namespace, "auto")
            assert config is not None
            assert config["num_speculative_tokens"] == 1
            assert config.get("num_speculative_tokens_per_batch_size") == st["tuning"].get("schedule")
            tuned_events = events(cluster, namespace, "TunedK")
            assert len(tuned_events) == 1
            assert f"K {k} -> 1" in tuned_events[0]["message"]
            measured = re.search(r"α (\d\.\d+) over (\d+) drafts", tuned_events[0]["message"])
            assert measured, tuned_events[0]["message"]  # the event names the evidence
            assert abs(float(measured[1]) - alpha) < 0.05  # the window still holds a little of the last phase
        finally:
            close(fakes)

        # the new revision's pods answer at the same α with K=1: the served K is the right one, it stays
        fakes = fakes_for(cluster, namespace, "auto", 1, "alpha", alpha)
        try:

            def judged() -> None:
                acc = status(cluster, namespace, "auto").get("acceptance") or {}
                assert acc.get("revision") == st["revision"], acc
                assert acc.get("k") == 1, acc
                assert acc.get("drafts", 0) >= 100, acc

            eventually(judged, timeout=60)
            scrapes(fakes, 20)  # longer than minIntervalSeconds
            assert rollouts(cluster, namespace, "auto") == 1
            assert "pending" not in status(cluster, namespace, "auto")["tuning"]
        finally:
            close(fakes)

    # an operator restart: its window is gone (it says so until it has filled again) and nothing rolls
    fakes = fakes_for(cluster, namespace, "auto", 1, "alpha", alpha)
    try:
        with operator_in(cluster, namespace):
            scrapes(fakes, 20)
            after = status(cluster, namespace, "auto")
            assert after["revision"] == st["revision"]
            assert after["numSpeculativeTokens"] == 1
            assert after["tuning"]["rollouts"] == 1
            assert rollouts(cluster, namespace, "auto") == 1
            assert effective(cluster, namespace, "auto") == ("True", "AboveBreakEven")
    finally:
        close(fakes)


def _pending(cluster: Cluster, namespace: str) -> int | None:
    pending = (status(cluster, namespace, "auto").get("tuning") or {}).get("pending") or {}
    return pending.get("k")


def _is(value: Any, expected: Any) -> None:
    assert value == expected, value


def test_auto_switches_speculation_off_and_a_probe_turns_it_back_on(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str
) -> None:
    serving = tuning(mode="Auto", minIntervalSeconds=3, allowDisable=True, probeIntervalSeconds=20)
    with operator_in(cluster, namespace):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("off", store, "good", creds, **serving))
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/off", "--timeout=120s")
        k = status(cluster, namespace, "off")["numSpeculativeTokens"]
        fakes = fakes_for(cluster, namespace, "off", k, "disagree")
        try:

            def off() -> dict[str, Any]:
                st = status(cluster, namespace, "off")
                assert st["numSpeculativeTokens"] == 0, st.get("tuning")
                return st

            st = eventually(off, timeout=60)
        finally:
            close(fakes)
        assert served_config(cluster, namespace, "off") is None  # vLLM serves the verifier alone
        assert rollouts(cluster, namespace, "off") == 1
        assert len(events(cluster, namespace, "SpeculationDisabled")) == 1
        assert st["tuning"]["probeK"] == k
        eventually(lambda: _is(effective(cluster, namespace, "off"), ("False", "SpeculationDisabled")), timeout=30)
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/off", "--timeout=120s")

        # the probe: after probeIntervalSeconds a revision speculates again with the last K
        def probing() -> dict[str, Any]:
            st = status(cluster, namespace, "off")
            assert st["numSpeculativeTokens"] == k, st.get("tuning")
            assert st["tuning"].get("probing") is True, st["tuning"]
            return st

        eventually(probing, timeout=60)
        assert rollouts(cluster, namespace, "off") == 2
        assert len(events(cluster, namespace, "ProbingAcceptance")) == 1
        config = served_config(cluster, namespace, "off")
        assert config is not None
        assert config["num_speculative_tokens"] == k
        # and acceptance has recovered: speculation stays on
        fakes = fakes_for(cluster, namespace, "off", k, "agree")
        try:
            eventually(lambda: _is(len(events(cluster, namespace, "SpeculationReenabled")), 1), timeout=60)
            eventually(lambda: _is(effective(cluster, namespace, "off"), ("True", "AboveBreakEven")), timeout=60)
            assert "probing" not in status(cluster, namespace, "off")["tuning"]
            scrapes(fakes, 10)  # longer than minIntervalSeconds
            assert rollouts(cluster, namespace, "off") == 2
        finally:
            close(fakes)
