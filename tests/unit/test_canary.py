"""The canary's verdict rule on scripted per-revision intervals, its start/keep/hold decisions and the children it
asks for (planning/canary.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from speculator_operator.api.canary import Canary
from speculator_operator.api.common import stamp
from speculator_operator.api.deployment import Acceptance, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import REVISION_LABEL, TRACK_LABEL
from speculator_operator.planning import canary as plan
from speculator_operator.planning.canary import Move, Rendered
from speculator_operator.telemetry.acceptance import Economics
from speculator_operator.telemetry.canary import Measured, analysis_now
from speculator_operator.telemetry.vllm_metrics import Sample

POLICY = Canary()  # promote after 3 passes in a row, roll back after 2 failures in a row or 3 in all


def iso(minute: int) -> str:
    return stamp(at(minute))


def at(minute: int) -> datetime:
    return datetime(2026, 12, 6, 10, tzinfo=UTC) + timedelta(minutes=minute)


def side(alpha: float, drafts: int = 1000) -> Acceptance:
    return Acceptance(alpha=alpha, mean_accepted_length=1 + 3 * alpha, rate=alpha, drafts=drafts)


def run(intervals: list[tuple[Acceptance, Acceptance]], policy: Canary = POLICY) -> tuple[Any, list[Any], int]:
    """Fold the scripted (candidate, incumbent) intervals, five minutes each, into a fresh canary: the final state,
    the per-interval verdicts (None: not counted) and how many verdicts were reached."""
    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "hf://org/v"}, "speculator": {"source": "hf://org/d"}, "upgradePolicy": {"canary": {}}}
    )
    status = SpeculatorDeploymentStatus(revision="inc", draft_revision="d1", ready_replicas=1, verifier_revision="v")
    canary = plan.start(spec, status, Rendered("cand", "d2", "v", "inc"), None, 1, at(0))
    said, verdicts = [], 0
    for i, (cand, inc) in enumerate(intervals):
        before = canary.verdict
        canary, verdict = plan.fold(canary, Measured(iso(5 * i), iso(5 * i + 5), cand, inc), policy, at(5 * i + 5))
        said.append(verdict)
        verdicts += int(canary.verdict is not None and before is None)
    return canary, said, verdicts


def test_steady_equal_acceptance_promotes_after_n_intervals() -> None:
    canary, said, verdicts = run([(side(0.7), side(0.7))] * 5)
    assert said[:3] == ["Pass"] * 3
    assert said[3:] == [None, None]
    assert (canary.state, canary.verdict, canary.verdict_at, verdicts) == ("Promoting", "Promoted", iso(15), 1)
    assert canary.counts.passed == 3
    assert canary.candidate.alpha == 0.7
    assert canary.incumbent.drafts == 1000


def test_a_candidate_twenty_points_lower_rolls_back_at_the_failure_limit() -> None:
    canary, said, _ = run([(side(0.5), side(0.7))] * 4)
    assert said == ["Fail", "Fail", None, None]
    assert (canary.state, canary.verdict, canary.counts.failed_in_a_row) == ("RolledBack", "RolledBack", 2)
    assert "α 0.5" in (canary.message or "")
    assert "α 0.7" in (canary.message or "")


def test_traffic_that_stops_is_inconclusive_never_a_rollback() -> None:
    quiet = (side(0.1, drafts=5), side(0.7, drafts=5))  # a tenth of the incumbent's α, but no evidence
    canary, said, verdicts = run([quiet] * 24)  # two hours
    assert set(said) == {"Inconclusive"}
    assert verdicts == 0
    assert canary.state == "Analyzing"
    assert canary.counts.inconclusive == 24
    assert canary.counts.failed == 0


def test_an_inconclusive_interval_breaks_no_run() -> None:
    good, quiet = (side(0.7), side(0.7)), (side(0.7, drafts=0), side(0.7, drafts=0))
    canary, said, _ = run([good, good, quiet, good])
    assert said == ["Pass", "Pass", "Inconclusive", "Pass"]
    assert canary.verdict == "Promoted"


def test_one_noisy_interval_inside_a_good_run_rolls_nothing_back() -> None:
    good, noisy = (side(0.7), side(0.7)), (side(0.4), side(0.7))
    canary, said, _ = run([good, good, noisy, good, good, good])
    assert said == ["Pass", "Pass", "Fail", "Pass", "Pass", "Pass"]
    assert canary.verdict == "Promoted"
    assert canary.counts.failed == 1


def test_alternating_evidence_for_an_hour_gives_at_most_one_verdict() -> None:
    good, bad = (side(0.7), side(0.7)), (side(0.4), side(0.7))
    canary, said, verdicts = run([good, bad] * 6)  # twelve five-minute intervals
    assert verdicts == 1
    assert canary.verdict == "RolledBack"
    assert said.count("Fail") == POLICY.max_failures
    assert said[:6] == ["Pass", "Fail"] * 3
    assert said[6:] == [None] * 6


def test_within_the_margin_passes_beyond_it_fails() -> None:
    policy = Canary(margin=0.05)
    assert plan.interval_verdict(policy, Measured("a", "b", side(0.65), side(0.70))) == "Pass"
    assert plan.interval_verdict(policy, Measured("a", "b", side(0.64), side(0.70))) == "Fail"
    lengths = Canary(metric="MeanAcceptedLength", margin=0.2)
    # mean accepted length 1 + 3α: 0.66 → 2.98, 0.70 → 3.1 (0.12 below: within 0.2)
    assert plan.interval_verdict(lengths, Measured("a", "b", side(0.66), side(0.70))) == "Pass"
    assert plan.interval_verdict(lengths, Measured("a", "b", side(0.6), side(0.70))) == "Fail"


def test_an_interval_counted_before_is_not_counted_again() -> None:
    canary, _, _ = run([(side(0.7), side(0.7))])
    again, verdict = plan.fold(canary, Measured(iso(0), iso(5), side(0.4), side(0.7)), POLICY, at(6))
    assert verdict is None
    assert again == canary
    later, verdict = plan.fold(canary, Measured(iso(5), iso(10), side(0.4), side(0.7)), POLICY, at(10))
    assert verdict == "Fail"
    assert later.counts.failed == 1
    assert later.counts.passed == 1


def _spec(canary: dict[str, Any] | None = None, replicas: int = 1, **serving: Any) -> SpeculatorDeploymentSpec:
    policy = {} if canary is None else {"canary": canary}
    return SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "hf://org/v"},
            "speculator": {"source": "hf://org/d"},
            "serving": {"replicas": replicas, **serving},
            "upgradePolicy": policy,
        }
    )


SERVING = SpeculatorDeploymentStatus(
    revision="inc", draft_revision="d1", verifier_revision="v", ready_replicas=1, num_speculative_tokens=3
)


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        (Rendered("cand", "d2", "v", "inc"), Move.START),  # a new draft, the verifier unchanged
        (Rendered("cand", "d2", "v2", "inc"), Move.NONE),  # the verifier moved too: rolls as ever
        (Rendered("cand", "d1", "v", "inc"), Move.NONE),  # the same draft (a spec edit of another field)
        (Rendered("inc", "d1", "v", "inc"), Move.NONE),  # nothing new
        (Rendered("cand", "d2", "v", "older"), Move.NONE),  # the incumbent is still rolling out
    ],
)
def test_when_a_canary_starts(new: Rendered, expected: Move) -> None:
    assert plan.decide(_spec({}), SERVING, new, 1) == expected
    assert plan.decide(_spec(None), SERVING, new, 1) == Move.NONE  # off by default


def test_a_canary_in_flight_goes_on_is_promoted_or_starts_over() -> None:
    spec, new = _spec({}), Rendered("cand", "d2", "v", "inc")
    analyzing = plan.start(spec, SERVING, new, None, 1, at(0))
    status = SERVING.model_copy(update={"canary": analyzing})
    assert plan.decide(spec, status, new, 1) == Move.KEEP
    assert plan.decide(spec, status, new, 2) == Move.START  # a spec edit: starts over
    assert plan.decide(spec, status, Rendered("newer", "d3", "v", "inc"), 1) == Move.START  # a newer draft
    promoting = status.model_copy(update={"canary": analyzing.model_copy(update={"state": "Promoting"})})
    assert plan.decide(spec, promoting, new, 1) == Move.PROMOTE


def test_a_rejected_draft_is_not_tried_again_until_its_bytes_or_the_spec_change() -> None:
    spec, new = _spec({}), Rendered("cand", "d2", "v", "inc")
    rejected = plan.start(spec, SERVING, new, None, 1, at(0)).model_copy(
        update={"state": "RolledBack", "verdict": "RolledBack"}
    )
    status = SERVING.model_copy(update={"canary": rejected})
    assert plan.decide(spec, status, new, 1) == Move.HOLD
    assert plan.decide(spec, status, Rendered("cand-k2", "d2", "v", "inc"), 1) == Move.HOLD  # another K: same draft
    assert plan.decide(spec, status, Rendered("newer", "d3", "v", "inc"), 1) == Move.START
    assert plan.decide(spec, status, new, 2) == Move.START


def test_replicas_of_each_side() -> None:
    assert (Canary().canary_replicas(1), Canary().incumbent_replicas(1)) == (1, 1)  # Surge: on top
    in_place = Canary(mode="InPlace", replicas="25%")
    assert (in_place.canary_replicas(8), in_place.incumbent_replicas(8)) == (2, 6)
    assert Canary(mode="InPlace", replicas="100%").canary_replicas(2) == 1  # the incumbent keeps one
    assert Canary(replicas="10%").canary_replicas(3) == 1  # rounded up


def test_the_canary_deployment_selects_its_own_track_only() -> None:
    rendered = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "m", "namespace": "ns", "labels": {"a": "m"}, "annotations": {REVISION_LABEL: "c"}},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"a": "m"}},
            "template": {"metadata": {"labels": {"a": "m", REVISION_LABEL: "c"}}, "spec": {}},
        },
    }
    out = plan.canary_workload(rendered, 1)
    assert out["metadata"]["name"] == "m-canary"
    assert out["spec"]["replicas"] == 1
    assert out["spec"]["selector"]["matchLabels"] == {"a": "m", TRACK_LABEL: "canary"}
    assert out["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "canary"
    assert "a" in out["spec"]["template"]["metadata"]["labels"]  # the Service's and the PDB's labels stay
    assert rendered["spec"]["replicas"] == 4
    assert TRACK_LABEL not in rendered["spec"]["selector"]["matchLabels"]


def test_in_place_scales_the_live_incumbent_without_changing_its_template() -> None:
    live = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "m",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "7",
            "generation": 3,
            "annotations": {REVISION_LABEL: "inc", "deployment.kubernetes.io/revision": "2"},
            "managedFields": [{}],
        },
        "spec": {"replicas": 4, "template": {"metadata": {"creationTimestamp": None}, "spec": {"x": 1}}},
        "status": {"replicas": 4},
    }
    out = plan.scaled(live, 3)
    assert out["spec"]["replicas"] == 3
    assert out["spec"]["template"] == {"metadata": {}, "spec": {"x": 1}}
    assert out["metadata"] == {"name": "m", "namespace": "ns", "annotations": {REVISION_LABEL: "inc"}}
    assert "status" not in out
    assert live["spec"]["replicas"] == 4


def test_the_analysis_begins_with_a_ready_candidate_and_counts_each_increment_in_one_interval() -> None:
    """telemetry/canary: no interval while the candidate's server is not scraped yet (it would only be
    Inconclusive); then one Measured per intervalSeconds, both sides from the same increments, none counted twice."""
    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "hf://org/v"}, "speculator": {"source": "hf://org/d"},
         "upgradePolicy": {"canary": {"intervalSeconds": 60, "minDrafts": 10}}}
    )  # fmt: skip
    status = SpeculatorDeploymentStatus(revision="inc", draft_revision="d1", ready_replicas=1, verifier_revision="v")
    status = status.model_copy(update={"canary": plan.start(spec, status, Rendered("cand", "d2", "v", "inc"), None, 1,
                                                            at(0))})  # fmt: skip
    assert analysis_now(None, status, spec, 0.0, iso(0), {"inc"}, 15) is None  # the candidate is not ready yet
    analysis = analysis_now(None, status, spec, 10.0, iso(0), {"inc", "cand"}, 15)
    assert analysis is not None
    econ = Economics(k=3, algorithm="eagle3", cost_ratio=0.05, max_k=3)

    def scrape(at: float, drafts: float, accepted_cand: float, accepted_inc: float) -> None:
        for pod, rev, acc in (("c", "cand", accepted_cand), ("i", "inc", accepted_inc)):
            sample = Sample(drafts=drafts, draft_tokens=3 * drafts, accepted=acc, per_position=(acc / 3,) * 3)
            analysis.window.observe(pod, rev, sample, at)

    scrape(10.0, 0, 0, 0)
    scrape(40.0, 100, 150, 300)
    assert analysis.measure(spec, econ, 40.0, iso(1)) is None  # 30 s of a 60 s interval
    scrape(70.0, 200, 300, 600)
    first = analysis.measure(spec, econ, 70.0, iso(2))
    assert first is not None
    assert first.candidate.drafts == first.incumbent.drafts == 200
    assert (first.candidate.rate or 0) < (first.incumbent.rate or 0)
    assert first.end == iso(2)
    scrape(100.0, 250, 375, 750)
    scrape(130.0, 300, 450, 900)
    second = analysis.measure(spec, econ, 130.0, iso(3))
    assert second is not None
    assert second.candidate.drafts == 100  # only what came after the first interval
    assert second.start == first.end
    assert analysis_now(analysis, status, spec, 131.0, iso(3), {"inc"}, 15) is analysis  # the same canary goes on
    ended = status.model_copy(update={"canary": None})
    assert analysis_now(analysis, ended, spec, 132.0, iso(3), {"inc", "cand"}, 15) is None
