"""Auto tuning of K and the schedule (planning/tuning.py), driven by scripted judgements: when it rolls,
when it holds, and that alternating evidence never makes it flap."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from speculator_operator.api.common import make_condition, stored
from speculator_operator.api.deployment import (
    Acceptance,
    SpeculatorDeploymentSpec,
    SpeculatorDeploymentStatus,
    TuningStatus,
)
from speculator_operator.domain.economics import best_k, speedup
from speculator_operator.domain.releases import get_release
from speculator_operator.planning.tuning import (
    applied,
    blocked,
    bounds,
    candidate,
    epoch,
    iso,
    plan_tuning,
    tuned_schedule,
)
from speculator_operator.render.serving import Draft, Inputs, Tuned, render
from speculator_operator.runtime.kube import status_patch
from speculator_operator.telemetry.acceptance import CONDITION, Economics, disabled_condition, plan_update

from ..clock import NOW

C = 0.05  # the pair's cost ratio in these tests
MAX_K = 5  # the checkpoint's speculative_tokens
T0 = 1_800_000_000.0


def spec(**tuning: Any) -> SpeculatorDeploymentSpec:
    serving: dict[str, Any] = {"tuning": {"mode": "Auto", "minIntervalSeconds": 30, **tuning}}
    if "k" in tuning:
        serving["numSpeculativeTokens"] = serving["tuning"].pop("k")
    return SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}, "serving": serving}
    )


def S(raw: dict[str, Any]) -> SpeculatorDeploymentStatus:
    return SpeculatorDeploymentStatus.model_validate(raw)


def T(raw: dict[str, Any] | TuningStatus | None) -> TuningStatus | None:
    """status.tuning as the pass holds it."""
    return None if raw is None else TuningStatus.model_validate(raw)


def A(raw: dict[str, Any]) -> Acceptance:
    """status.acceptance as a scrape computes it."""
    return Acceptance.model_validate(raw)


def acc(alpha: float, drafts: int = 1000) -> Acceptance:
    return Acceptance(alpha=alpha, drafts=drafts)


class Loop:
    """The scrape loop's use of plan_tuning: the state carried between judgements, the served K moved by
    each rollout (as the render would), the rollouts and events counted."""

    def __init__(self, s: SpeculatorDeploymentSpec, k: int = MAX_K) -> None:
        self.spec, self.k, self.state = s, k, None
        self.rollouts: list[tuple[float, int]] = []
        self.events: list[tuple[str, str, str]] = []

    def judge(self, t: float, a: Acceptance | None, min_samples: int = 200) -> None:
        p = plan_tuning(self.spec, self.state, a, Economics(self.k, "eagle3", C, MAX_K), t, min_samples)
        self.state = p.state  # type: ignore[assignment]
        self.events += p.events
        if p.rollout:
            tuned = applied(self.spec, T(self.state), MAX_K)
            assert tuned is not None
            self.k = tuned.k
            self.rollouts.append((t, tuned.k))


def test_the_model_behind_the_numbers() -> None:
    # the α values below and the K the economics picks for them
    assert best_k(0.3, C, "eagle3", MAX_K)[0] == 2
    assert best_k(0.9, C, "eagle3", MAX_K)[0] == MAX_K
    assert best_k(0.01, C, "eagle3", MAX_K)[0] == 0


def test_recommend_and_off_keep_no_state_and_roll_nothing() -> None:
    for mode in ("Recommend", "Off"):
        p = plan_tuning(spec(mode=mode), T({"mode": "Auto", "k": 2}), acc(0.3), Economics(5, "eagle3", C, 5), T0, 200)
        assert (p.state, p.rollout, p.events) == (None, False, [])
        assert applied(spec(mode=mode), T({"mode": "Auto", "k": 2}), MAX_K) is None


def test_a_k_set_in_the_spec_is_left_alone() -> None:
    p = plan_tuning(spec(k=4), None, acc(0.3), Economics(4, "eagle3", C, 5), T0, 200)
    assert not p.rollout
    assert p.state is not None
    assert "numSpeculativeTokens is set" in (p.state.note or "")
    assert applied(spec(k=4), T({"mode": "Auto", "k": 2}), MAX_K) is None


def test_sustained_evidence_rolls_exactly_once() -> None:
    loop = Loop(spec())
    for i in range(0, 121, 5):  # two minutes of judgements every 5 s, all pointing to K=2
        loop.judge(T0 + i, acc(0.3))
    assert loop.rollouts == [(T0 + 30, 2)]  # held for minIntervalSeconds, then once
    assert [e[1] for e in loop.events] == ["TunedK"]
    assert "K 5 -> 2" in loop.events[0][2]
    assert "α 0.300" in loop.events[0][2]
    assert "held 30 s" in loop.events[0][2]
    assert loop.state is not None
    assert (loop.state.k, loop.state.rollouts) == (2, 1)
    assert loop.state.pending is None


def test_evidence_shorter_than_min_interval_rolls_nothing() -> None:
    loop = Loop(spec())
    for i in range(0, 26, 5):
        loop.judge(T0 + i, acc(0.3))
    assert loop.state is not None
    assert loop.state.pending.k == 2
    for i in range(30, 200, 5):
        loop.judge(T0 + i, acc(0.9))  # the served K is right again: the candidate is dropped
    assert loop.rollouts == []
    assert loop.state.pending is None


@pytest.mark.parametrize("period", [5, 10, 20, 25])
def test_alternating_evidence_never_flaps(period: int) -> None:
    """Evidence that swings between two K's faster than minIntervalSeconds never rolls a revision."""
    loop = Loop(spec())
    for i in range(0, 3600, 5):
        loop.judge(T0 + i, acc(0.3 if (i // period) % 2 else 0.9))
    assert loop.rollouts == []


def test_after_a_rollout_going_back_needs_the_full_interval_again() -> None:
    loop = Loop(spec())
    for i in range(0, 61, 5):
        loop.judge(T0 + i, acc(0.3))
    assert loop.rollouts == [(T0 + 30, 2)]
    # the evidence swings back and forth around the new K: still one rollout
    for i in range(65, 585, 5):  # 15 s each way, ending on the new K's side
        loop.judge(T0 + i, acc(0.9 if (i // 15) % 2 else 0.3))
    assert len(loop.rollouts) == 1
    # sustained evidence for the old K from 585 s: one more, 30 s later, not a series
    for i in range(585, 900, 5):
        loop.judge(T0 + i, acc(0.9))
    assert loop.rollouts == [(T0 + 30, 2), (T0 + 615, MAX_K)]


def test_a_judgement_without_enough_samples_starts_afresh() -> None:
    """An operator restart (the window is in memory) or a new revision: the candidate waits a full interval
    again from the first judgement with enough samples."""
    loop = Loop(spec())
    for i in range(0, 26, 5):
        loop.judge(T0 + i, acc(0.3))
    loop.judge(T0 + 27, acc(0.3, drafts=10))  # a restart: the window refills
    assert loop.state is not None
    assert loop.state.pending is None
    for i in range(30, 56, 5):
        loop.judge(T0 + i, acc(0.3))
    assert loop.rollouts == []
    loop.judge(T0 + 60, acc(0.3))
    assert loop.rollouts == [(T0 + 60, 2)]


def test_hysteresis_keeps_a_k_that_is_nearly_as_good() -> None:
    # at α = 0.5 the best K beats K = 2 by less than 5 %: no candidate at all
    alpha = 0.5
    best, gain = best_k(alpha, C, "eagle3", MAX_K)
    near = speedup(alpha, 2, C)
    assert best != 2
    assert gain < near * 1.05
    k, _, _ = candidate(spec(), alpha, Economics(2, "eagle3", C, MAX_K), C)
    assert k == 2
    k, _, _ = candidate(spec(hysteresis=0), alpha, Economics(2, "eagle3", C, MAX_K), C)
    assert k == best


def test_bounds_hold_and_the_checkpoint_caps_them() -> None:
    assert bounds(spec(minK=2, maxK=3), MAX_K) == (2, 3)
    assert bounds(spec(maxK=9), MAX_K) == (1, MAX_K)
    k, _, _ = candidate(spec(minK=3), 0.3, Economics(MAX_K, "eagle3", C, MAX_K), C)
    assert k == 3
    k, _, _ = candidate(spec(maxK=1), 0.9, Economics(1, "eagle3", C, MAX_K), C)
    assert k == 1
    # a tuned K outside bounds the user set since is clamped to them
    tuned = applied(spec(minK=3), T({"mode": "Auto", "k": 2, "schedule": [[1, 8, 2], [9, 256, 1]]}), MAX_K)
    assert tuned == Tuned(3)


def test_allow_disable_turns_speculation_off_and_a_probe_measures_again() -> None:
    s = spec(allowDisable=True, probeIntervalSeconds=600)
    loop = Loop(s, k=3)
    for i in range(0, 31, 5):
        loop.judge(T0 + i, acc(0.01))
    assert loop.rollouts == [(T0 + 30, 0)]
    assert [e[1] for e in loop.events] == ["SpeculationDisabled"]
    assert loop.state is not None
    assert loop.state.probe_at == iso(T0 + 630)
    assert loop.state.probe_k == 3
    assert applied(s, T(loop.state), MAX_K) == Tuned(0)
    for i in range(35, 630, 5):  # off: nothing to measure, nothing rolls until the probe is due
        loop.judge(T0 + i, None)
    assert len(loop.rollouts) == 1
    loop.judge(T0 + 630, None)
    assert loop.rollouts[-1] == (T0 + 630, 3)
    assert loop.state.probing is True
    assert loop.events[-1][1] == "ProbingAcceptance"
    # the probe finds that speculation pays again: it stays on
    loop.judge(T0 + 700, acc(0.9))
    assert loop.events[-1][1] == "SpeculationReenabled"
    assert loop.state.probing is None
    # without allowDisable, a tuned-off state renders the last K
    assert applied(spec(), T({"mode": "Auto", "k": 0, "probeK": 3}), MAX_K) == Tuned(3)
    # the condition while it is off says when it measures again
    cond = disabled_condition(4, T({"probeAt": iso(T0 + 630), "evidence": "α 0.010"}))
    assert (cond.status, cond.reason) == ("False", "SpeculationDisabled")
    assert iso(T0 + 630) in cond.message


def test_the_schedule_lowers_k_with_load_and_the_render_serves_it() -> None:
    s = spec(saturationTokens=64)
    raw = tuned_schedule(s, 4, 0.8, C, "eagle3")
    assert raw is not None
    assert raw[0][:1] == [1]
    assert raw[0][2] == 4
    assert raw[-1][1] == s.serving.max_num_seqs
    ks = [r[2] for r in raw]
    assert ks == sorted(ks, reverse=True)
    assert ks[-1] < 4
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(raw))  # contiguous ranges
    assert tuned_schedule(spec(saturationTokens=1_000_000), 4, 0.8, C, "eagle3") is None  # one K serves all
    cut = SpeculatorDeploymentSpec.model_validate(
        {**json.loads(s.model_dump_json(by_alias=True)), "serving": {"cutoff": {"maxBatchSize": 8}}}
    )
    assert tuned_schedule(cut, 4, 0.8, C, "eagle3") is None  # the user's cut-off stands

    def config(tuned: Tuned | None) -> dict[str, Any] | None:
        inputs = Inputs("d", "ns", s, get_release(), Draft("eagle3", MAX_K, "r"), "v", tuned=tuned)
        args = render(inputs).vllm_args
        if "--speculative-config" not in args:
            return None
        return json.loads(args[args.index("--speculative-config") + 1])  # type: ignore[no-any-return]

    sched = tuple(tuple(r) for r in raw)
    served = config(Tuned(4, sched))  # type: ignore[arg-type]
    assert served is not None
    assert served["num_speculative_tokens"] == 4
    assert served["num_speculative_tokens_per_batch_size"] == raw
    assert config(Tuned(0)) is None  # tuned off: vLLM serves the verifier alone
    assert config(None) is not None
    assert config(None)["num_speculative_tokens"] == MAX_K


def test_times_round_trip() -> None:
    assert epoch(iso(T0)) == T0
    assert epoch("not a time") is None
    assert epoch(None) is None


def test_plan_update_writes_and_warns_once() -> None:
    below = make_condition(1, CONDITION, False, "BelowBreakEven", "α 0.01")
    first = plan_update(S({}), A({"rate": 0.01, "drafts": 500}), below, None, now=NOW)
    assert [e[:2] for e in first.events] == [("Warning", "BelowBreakEven")]
    assert first.status is not None
    written = S({k: v for k, v in stored(first.status).items() if k in ("conditions", "acceptance")})
    again = plan_update(written, A({"rate": 0.01, "drafts": 500}), below, None, now=NOW)
    assert (again.status, again.events) == (None, [])  # unchanged: no write, no second event
    off = plan_update(written, None, disabled_condition(1, T({"probeAt": "x"})), T({"mode": "Auto", "k": 0}), now=NOW)
    assert off.events == []  # still False: the tuning's own event says why
    assert off.status is not None
    assert stored(off.status)["tuning"] == {"mode": "Auto", "k": 0}
    assert stored(off.status)["acceptance"] == stored(written)["acceptance"]  # not measured: left as it was
    tuned = S({**stored(written), "tuning": {"mode": "Auto", "k": 2}})
    gone = plan_update(tuned, None, below, None, now=NOW)
    assert gone.status is not None
    assert stored(gone.status) == stored(written)  # the tuning block removed, nothing else moved


def test_status_patches_remove_what_an_object_lost() -> None:
    old = {"tuning": {"k": 2, "pending": {"k": 1}}, "phase": "Ready"}
    new = {"tuning": {"k": 2}, "phase": "Ready"}
    assert status_patch(old, new) == {"tuning": {"k": 2, "pending": None}}
    assert status_patch(new, new) == {}


def test_each_transition_posts_one_event_and_a_restart_is_not_news() -> None:
    above = make_condition(1, CONDITION, True, "AboveBreakEven", "α 0.9")
    first = plan_update(S({}), A({"rate": 0.9, "drafts": 500, "revision": "r"}), above, None, now=NOW)
    assert [e[:2] for e in first.events] == [("Normal", "AboveBreakEven")]
    assert first.status is not None
    written = first.status
    waiting = make_condition(1, CONDITION, None, "NotEnoughSamples", "0 drafts in the window")
    refill = {"drafts": 0, "revision": "r", "note": "0 drafts"}
    # a restarted operator refilling its window: the judgement on record stands, nothing is written
    held = plan_update(written, A(refill), waiting, None, refilling=True, now=NOW)
    assert (held.status, held.events) == (None, [])
    # a new revision is judged afresh, and so is the old one once the window has had its span
    assert (
        plan_update(written, A(dict(refill, revision="r2")), waiting, None, refilling=True, now=NOW).status is not None
    )
    later = plan_update(written, A(refill), waiting, None, now=NOW)
    assert later.status is not None
    assert later.status.conditions[0].status == "Unknown"
    assert later.events == []


def test_a_tuned_revision_waits_while_an_input_change_is_held_back() -> None:
    ready = {
        "phase": "Ready",
        "conditions": [{"type": "VerifierCurrent", "status": "True", "reason": "RevisionResolved"}],
    }
    assert blocked(S(ready)) is None
    paused = {**ready, "conditions": [{"type": "VerifierCurrent", "status": "False", "reason": "VerifierChanged"}]}
    why = blocked(S(paused))
    assert why is not None
    assert "VerifierChanged" in why
    retraining = {**ready, "retrain": {"job": "j", "verifierRevision": "v2"}}
    assert blocked(S(retraining)) == "a retraining is in flight"
    assert blocked(S({**ready, "phase": "Degraded"})) is not None
    s = spec()
    econ = Economics(MAX_K, "eagle3", C, MAX_K)
    state = T({"mode": "Auto", "pending": {"k": 2, "since": iso(T0), "evidence": "e"}})
    assert state is not None
    held = plan_tuning(s, state, acc(0.3), econ, T0 + 60, 200, hold=why)
    assert not held.rollout
    assert held.state is not None
    assert held.state.pending == state.pending  # the evidence stays held
    assert "waits" in (held.state.note or "")
    # and rolls at the first judgement once nothing holds it back
    assert plan_tuning(s, held.state, acc(0.3), econ, T0 + 61, 200).rollout
