"""The learning trigger (planning/learning.py) on scripted windows: the live baseline, sustained drift against noise,
the samples every trigger needs, the gates that hold it back, a rejected learned draft, the per-pod cap, and
windows fed twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from speculator_operator.api.canary import CanaryStatus
from speculator_operator.api.common import evolve, make_condition, stamp
from speculator_operator.api.deployment import RetrainStatus, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.learning import LearningRun, LearningStatus, LearningTrigger
from speculator_operator.planning.learning import (
    Planned,
    Window,
    judged,
    plan_trigger,
    run_finished,
    run_started,
)
from speculator_operator.render.capture import per_pod_budget

T0 = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
INTERVAL = timedelta(seconds=300)
TEMPLATE = {"algorithm": "eagle3", "data": {"sources": ["hf:org/chats"]}, "output": {"uri": "s3://drafts/q"}}


def spec(trigger: dict[str, Any] | None = None, **canary: Any) -> SpeculatorDeploymentSpec:
    """A deployment that learns: drift over 3 baseline windows, 3 windows below, 100 new samples, 1 h cooldown."""
    trigger = {"drift": {}, "minNewSamples": 100, "cooldownSeconds": 3600} if trigger is None else trigger
    return SpeculatorDeploymentSpec.model_validate({
        "verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"},
        "upgradePolicy": {"canary": canary, "trainTemplate": TEMPLATE},
        "learning": {"storage": {"location": "s3://captures/qwen"}, "trigger": trigger},
    })  # fmt: skip


SPEC = spec()
SERVING = SpeculatorDeploymentStatus(verifier_revision="v1", draft_revision="d1")


def window(i: int, alpha: float | None, drafts: int = 500, captured: int = 10, **kw: Any) -> Window:
    """The i-th 5-minute window of draft d1 under verifier v1."""
    args: dict[str, Any] = {"draft_revision": "d1", "verifier_revision": "v1", **kw}
    return Window(end=stamp(T0 + i * INTERVAL), alpha=alpha, drafts=drafts, captured=captured, **args)


def at(i: int) -> datetime:
    return T0 + i * INTERVAL


def run(
    alphas: list[float | None],
    s: SpeculatorDeploymentSpec = SPEC,
    status: SpeculatorDeploymentStatus = SERVING,
    first: int = 1,
    **kw: Any,
) -> tuple[SpeculatorDeploymentStatus, list[Planned]]:
    """One pass per window, each status carried into the next pass; the status after them and every pass's plan."""
    passes = []
    for i, alpha in enumerate(alphas, start=first):
        p = plan_trigger(s, status, [window(i, alpha, **kw)], at(i))
        status = evolve(status, None, learning=p.learning)
        passes.append(p)
    return status, passes


def fired(passes: list[Planned]) -> list[int]:
    return [i for i, p in enumerate(passes) if p.fire is not None]


BASE = [0.7, 0.7, 0.7]  # makes a baseline of 0.7


def test_the_first_counted_windows_of_the_served_draft_make_a_drafts_weighted_baseline() -> None:
    status, _ = run([0.6, None, 0.9], drafts=0)  # no drafts: no evidence either way
    assert status.learning is not None
    assert status.learning.baseline is None
    windows = [window(1, 0.6, drafts=200), window(2, 0.8, drafts=300), window(3, 0.2, drafts=50),  # < minDrafts 200
               window(4, 0.1, draft_revision="d0"), window(5, 0.7, drafts=400)]  # fmt: skip
    p = plan_trigger(SPEC, SERVING, windows, at(5))
    b = p.learning.baseline
    assert b is not None
    assert b.value == pytest.approx((0.6 * 200 + 0.8 * 300 + 0.7 * 400) / 900)  # only windows 1, 2 and 5
    assert (b.windows, b.drafts, b.draft_revision, b.complete, b.since) == (3, 900, "d1", True, window(1, 0).end)
    assert b.metric == "Alpha"
    assert [e[1] for e in p.events] == ["LearningBaselineSet"]
    assert p.learning.below_windows == 0  # judged only after the baseline windows


def test_a_window_with_fewer_drafts_than_the_canarys_min_drafts_counts_neither_way() -> None:
    s = spec(minDrafts=1000)
    status, _ = run([0.7, 0.7, 0.7], s=s, drafts=1000)
    status, _ = run([0.1, 0.1, 0.1], s=s, status=status, first=4, drafts=999)
    assert status.learning is not None
    assert status.learning.below_windows == 0
    status, _ = run([0.1], s=s, status=status, first=7, drafts=1000)
    assert status.learning is not None
    assert status.learning.below_windows == 1


def test_a_new_draft_revision_starts_a_new_baseline() -> None:
    status, _ = run([*BASE, 0.5])
    assert status.learning is not None
    assert status.learning.baseline is not None
    assert status.learning.below_windows == 1
    promoted = evolve(status, None, draft_revision="d2")
    status, _ = run([0.3, 0.5], status=promoted, first=5)  # windows of d1 still scraped: not d2's
    assert status.learning is not None
    assert status.learning.baseline is None
    assert status.learning.below_windows == 0
    status, _ = run([0.4, 0.4, 0.4], status=status, first=7, draft_revision="d2")
    b = status.learning.baseline if status.learning else None
    assert b is not None
    assert (b.draft_revision, b.value, b.complete) == ("d2", pytest.approx(0.4), True)


def test_sustained_drift_fires_exactly_one_learning_run() -> None:
    _status, passes = run([*BASE, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6], captured=20)
    assert fired(passes) == [5]  # the third window below 0.7 - 0.05, with 120 new samples by then
    p = passes[5]
    assert p.fire is not None
    assert p.fire.reason == "Drift"
    assert "0.7000" in p.fire.message
    assert "3 windows in a row" in p.fire.message
    assert p.events == [("Normal", "LearningTriggered", f"Drift: {p.fire.message}")]
    learning = p.learning
    assert learning.last_trigger == LearningTrigger(at=stamp(at(6)), reason="Drift", message=p.fire.message)
    assert (learning.samples_since_run, learning.below_windows) == (0, 0)
    assert learning.next_trigger_at == stamp(at(6) + timedelta(seconds=3600))
    assert learning.blocked is None
    after = passes[6].learning
    assert after.blocked is not None
    assert after.blocked.startswith("the cooldown holds until")


def test_noise_around_the_threshold_never_fires() -> None:
    status, passes = run([*BASE] + [0.6, 0.7, 0.6, 0.6, 0.8, 0.6, 0.66, 0.6, 0.6, 0.65] * 3)
    assert fired(passes) == []
    assert max(p.learning.below_windows or 0 for p in passes) == 2
    # exactly at baseline - margin is not below it
    status, passes = run([*BASE, 0.65, 0.65, 0.65, 0.65])
    assert fired(passes) == []
    assert status.learning is not None
    assert status.learning.below_windows == 0


def test_drift_without_enough_new_samples_waits_for_them() -> None:
    status, passes = run([*BASE, 0.5, 0.5, 0.5, 0.5], captured=5)  # 35 samples by the 7th window
    assert fired(passes) == []
    assert status.learning is not None
    assert status.learning.below_windows == 4
    assert status.learning.samples_since_run == 35
    assert status.learning.blocked is None
    status, passes = run([0.5], status=status, first=8, captured=65)
    assert fired(passes) == [0]
    assert passes[0].fire is not None
    assert passes[0].fire.reason == "Drift"


def test_without_drift_new_samples_alone_fire() -> None:
    s = spec({"minNewSamples": 30, "cooldownSeconds": 0})
    _status, passes = run([0.9, 0.1, None, 0.5, 0.5, 0.5, 0.5], s=s, captured=10)
    assert fired(passes) == [2, 5]  # 30 samples, then 30 more (no cooldown)
    first = passes[2]
    assert first.fire is not None
    assert first.fire.reason == "Samples"
    assert first.fire.message == "30 new samples captured (minNewSamples 30)"
    assert first.learning.baseline is None
    assert first.learning.below_windows is None


def test_only_the_current_verifiers_samples_count_and_a_verifier_change_starts_afresh() -> None:
    status, _ = run([*BASE, 0.6], captured=10)
    learning = status.learning
    assert learning is not None
    assert (learning.samples_since_run, learning.captured) == (40, 40)
    status, _ = run([0.6], status=status, first=5, verifier_revision="v0", captured=7)  # an old pod's last window
    learning = status.learning
    assert learning is not None
    assert (learning.samples_since_run, learning.captured) == (40, 47)
    assert learning.below_windows == 1  # and its acceptance did not count either
    moved = evolve(status, None, verifier_revision="v2")
    status, _ = run([0.6], status=moved, first=6, verifier_revision="v2", captured=3)
    learning = status.learning
    assert learning is not None
    assert (learning.verifier_revision, learning.samples_since_run, learning.captured) == ("v2", 3, 50)
    assert learning.baseline is not None
    assert learning.baseline.windows == 1


def canary(state: str) -> CanaryStatus:
    return CanaryStatus.model_validate({"state": state, "candidate": {"revision": "r2"},
                                        "incumbent": {"revision": "r1"}})  # fmt: skip


GATES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    # case: (deployment status fields, status.learning fields, the start of `blocked`)
    "learning run": ({}, {"job": LearningRun(name="q-learn-1", state="Running")},
                     "a learning run is in flight: SpeculatorTrainJob q-learn-1"),
    "awaiting verdict": ({}, {"job": LearningRun(name="q-learn-1", state="Succeeded")},
                         "a learning run awaits its canary's verdict"),
    "retrain": ({"retrain": RetrainStatus(job="q-retrain-v2", verifier_revision="v2")}, {},
                "a retraining is in flight: SpeculatorTrainJob q-retrain-v2 for verifier v2"),
    "verifier change": ({"conditions": [make_condition(1, "VerifierCurrent", False, "VerifierChanged")]}, {},
                        "the verifier is changing (VerifierChanged)"),
    "canary analyzing": ({"canary": canary("Analyzing")}, {}, "a canary is analyzing: revision r2"),
    "canary promoting": ({"canary": canary("Promoting")}, {}, "a canary is promoting: revision r2"),
    "cooldown": ({}, {"last_trigger": LearningTrigger(at=stamp(at(8) - timedelta(seconds=3599)), reason="Samples")},
                 "the cooldown holds until 2026-12-07T12:40:01Z (cooldownSeconds 3600)"),
    "rejected": ({}, {"rejected_at_samples": 30, "job": LearningRun(name="q-learn-1", state="Succeeded",
                                                                    verdict="RolledBack")},
                 "a learned draft was rolled back: 70 of 100 new samples captured since"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(GATES))
def test_a_gate_holds_the_trigger_back_and_says_which(case: str) -> None:
    fields, learning_fields, words = GATES[case]
    # a sustained drift with 70 samples, then 30 more: every condition of the trigger holds in the last window
    status = evolve(SERVING, None, **fields)
    status, _ = run([*BASE, 0.5, 0.5, 0.5, 0.5], status=status)
    assert status.learning is not None
    status = evolve(status, None, learning=evolve(status.learning, None, **learning_fields))
    p = plan_trigger(SPEC, status, [window(8, 0.5, captured=30)], at(8))
    assert p.fire is None
    assert [e[1] for e in p.events] == []
    assert p.learning.blocked is not None
    assert p.learning.blocked.startswith(words), p.learning.blocked
    # the same, without the gate: it fires
    unset = evolve(status.learning, None, **dict.fromkeys(learning_fields))
    clear = evolve(status, None, **dict.fromkeys(fields), learning=unset)
    p = plan_trigger(SPEC, clear, [window(8, 0.5, captured=30)], at(8))
    assert p.fire is not None
    assert p.learning.blocked is None


def test_the_cooldown_ends_and_an_edit_of_it_applies_at_once() -> None:
    s = spec({"minNewSamples": 10, "cooldownSeconds": 3600})
    status, passes = run([0.5] * 16, s=s)  # 10 samples a window
    assert fired(passes) == [0, 12]  # fired at window 1, again at window 13 (an hour later)
    assert passes[11].learning.blocked == "the cooldown holds until 2026-12-07T13:05:00Z (cooldownSeconds 3600)"
    shorter = spec({"minNewSamples": 10, "cooldownSeconds": 1800})
    p = plan_trigger(shorter, status, [window(17, 0.5)], at(17))
    assert p.fire is None
    assert p.learning.next_trigger_at == stamp(at(13) + timedelta(seconds=1800))
    p = plan_trigger(shorter, status, [window(19, 0.5)], at(19))
    assert p.fire is not None  # 1800 s after the last trigger, not 3600


def test_a_rolled_back_learned_draft_holds_the_next_trigger_until_min_new_samples_more() -> None:
    s = spec({"minNewSamples": 50, "cooldownSeconds": 0})
    status, passes = run([0.5] * 5, s=s)
    assert fired(passes) == [4]
    assert status.learning is not None
    assert status.learning.captured == 50
    learning = run_started(status.learning, "q-learn-1", "s3://captures/qwen/snapshots/1.json", 50, at(5))
    assert learning.job == LearningRun(name="q-learn-1", snapshot="s3://captures/qwen/snapshots/1.json", samples=50,
                                       state="Running", started_at=stamp(at(5)))  # fmt: skip
    status = evolve(status, None, learning=learning)
    status, passes = run([0.5] * 3, s=s, status=status, first=6)
    assert fired(passes) == []
    assert passes[-1].learning.blocked is not None
    assert status.learning is not None
    assert status.learning.samples_since_run == 30
    learning = judged(run_finished(status.learning, "Succeeded", at(8)), "RolledBack")
    assert learning.job is not None
    assert (learning.job.state, learning.job.verdict) == ("Succeeded", "RolledBack")
    assert learning.job.finished_at == stamp(at(8))
    assert learning.rejected_at_samples == 80
    status = evolve(status, None, learning=learning)
    status, passes = run([0.5] * 5, s=s, status=status, first=9)  # 80 samples since the trigger, 50 since the verdict
    assert fired(passes) == [4]
    assert passes[3].learning.blocked == "a learned draft was rolled back: 40 of 50 new samples captured since"


def test_a_failed_learning_run_ends_the_run_and_a_promoted_one_lets_the_next_trigger_fire() -> None:
    s = spec({"minNewSamples": 10, "cooldownSeconds": 0})
    status, _ = run([0.5], s=s)
    assert status.learning is not None
    for learning in (
        run_finished(run_started(status.learning, "j", "s3://x/1", 10, at(2)), "Failed", at(3)),
        judged(run_finished(run_started(status.learning, "j", "s3://x/1", 10, at(2)), "Succeeded", at(3)), "Promoted"),
    ):
        p = plan_trigger(s, evolve(status, None, learning=learning), [window(4, 0.5)], at(4))
        assert p.fire is not None
        assert p.learning.rejected_at_samples is None
    assert run_finished(LearningStatus(), "Failed", at(1)) == LearningStatus()
    assert judged(LearningStatus(), "RolledBack") == LearningStatus()


def test_the_same_windows_fed_again_change_nothing() -> None:
    windows = [window(i, a) for i, a in enumerate([*BASE, 0.6, 0.6], start=1)]
    once = plan_trigger(SPEC, SERVING, list(reversed(windows)), at(5))  # in any order
    assert once.learning.counted_until == windows[-1].end
    assert once.learning.below_windows == 2
    assert once.learning.captured == 50
    status = evolve(SERVING, None, learning=once.learning)
    again = plan_trigger(SPEC, status, windows, at(6))
    assert again.learning == once.learning
    assert again.events == []
    assert again.fire is None
    # one new window among them counts alone: the third below, with 60 samples: not yet 100
    more = plan_trigger(SPEC, status, [*windows, window(6, 0.6)], at(6))
    assert (more.learning.below_windows, more.learning.captured, more.fire) == (3, 60, None)


def test_a_pass_without_windows_keeps_the_counts_and_without_learning_changes_nothing() -> None:
    status, _ = run([*BASE])
    p = plan_trigger(SPEC, status, [], at(4))
    assert p.learning == evolve(status.learning, None, blocked=None)
    assert p.fire is None
    plain = SpeculatorDeploymentSpec.model_validate({"verifier": {"model": "Qwen/Qwen3-8B"},
                                                     "speculator": {"source": "hf://acme/d"}})  # fmt: skip
    assert plan_trigger(plain, SERVING, [window(1, 0.1)], at(1)) == Planned(LearningStatus())


@pytest.mark.parametrize(
    ("max_per_hour", "replicas", "each"),
    [(3600, 1, 3600), (3600, 4, 900), (10, 3, 3), (2, 3, 0), (1, 1, 1), (5, 0, 0), (10_000_000, 1024, 9765)],
)
def test_the_hourly_cap_is_the_deployments_shared_down_by_floor(max_per_hour: int, replicas: int, each: int) -> None:
    assert per_pod_budget(max_per_hour, replicas) == each
    assert each * replicas <= max_per_hour  # the pods together never exceed it
    # vLLM builds one capture per API-server process: the pod's share is divided again
    assert per_pod_budget(max_per_hour, replicas, 2) == (max_per_hour // (2 * replicas) if replicas else 0)
    assert per_pod_budget(max_per_hour, replicas, 2) * 2 * replicas <= max_per_hour
