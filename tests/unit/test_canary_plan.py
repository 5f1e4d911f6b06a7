"""A canary through the deployment planner (planning/deployment.plan with planning/canary): what a pass applies,
deletes and writes when a new draft arrives, while it is analysed, and after each verdict."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api.deployment import Acceptance, SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import REVISION_LABEL, TRACK_LABEL
from speculator_operator.domain.releases import get_release
from speculator_operator.planning import canary as canaries
from speculator_operator.planning.deployment import Observed, Plan, plan
from speculator_operator.planning.health import deployment_health
from speculator_operator.planning.tuning import blocked
from speculator_operator.telemetry.canary import Measured

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint
from ..clock import NOW

RAW = {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}, "serving": {"replicas": 2},
       "upgradePolicy": {"canary": {}}}  # fmt: skip
SPEC = SpeculatorDeploymentSpec.model_validate(RAW)
IN_PLACE = SpeculatorDeploymentSpec.model_validate({**RAW, "upgradePolicy": {"canary": {"mode": "InPlace"}}})


def drafts(tmp_path: Path, n: int) -> list[Any]:
    """`n` audited eagle3 drafts for Qwen3-8B under `n` resolved revisions (new bytes under the same source)."""
    out = []
    for i in range(n):
        write_checkpoint(tmp_path / f"d{i}", *eagle3())
        report = audit(str(tmp_path / f"d{i}"), verifier=QWEN3_8B, release=get_release())
        out.append(replace(report, checkpoint=replace(report.checkpoint, revision=f"{i}abc{i}")))  # as resolved
    assert len({d.checkpoint.revision for d in out}) == n
    return out


@pytest.fixture
def three(tmp_path: Path) -> list[Any]:
    return drafts(tmp_path, 3)


def live(p: Plan, ready: int | None = None) -> dict[str, Any]:
    """The main Deployment as the apiserver would return it once `p` was applied and rolled out."""
    workload = next(c for c in p.children or [] if c["kind"] == "Deployment" and not c["metadata"]["name"].endswith(
        canaries.CANARY_SUFFIX))  # fmt: skip
    replicas = workload["spec"]["replicas"]
    n = replicas if ready is None else ready
    return {**workload, "metadata": {**workload["metadata"], "generation": 1, "uid": "u1", "resourceVersion": "9"},
            "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": n, "updatedReplicas": n,
                       "availableReplicas": n}}  # fmt: skip


def conds(status: SpeculatorDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def serving(spec: SpeculatorDeploymentSpec, draft: Any) -> tuple[Plan, dict[str, Any]]:
    """The pair with `draft` rolled out and Ready."""
    first = plan("q", "ns", "u", spec, get_release(), Observed(1, SpeculatorDeploymentStatus(), "v1", draft), now=NOW)
    child = live(first)
    ready = plan("q", "ns", "u", spec, get_release(), Observed(1, first.status, "v1", draft, child=child), now=NOW)
    assert ready.status.phase == "Ready"
    return ready, child


def kinds(p: Plan) -> list[tuple[str, str]]:
    return [(c["kind"], c["metadata"]["name"]) for c in p.children or []]


def measured(minute: int, cand: float, inc: float) -> Measured:
    def side(alpha: float) -> Acceptance:
        return Acceptance(alpha=alpha, mean_accepted_length=1 + 2 * alpha, rate=alpha / 2, drafts=500)

    return Measured(f"2099-01-01T00:{minute:02d}:00Z", f"2099-01-01T00:{minute + 5:02d}:00Z", side(cand), side(inc))


def test_a_new_draft_starts_a_canary_beside_the_untouched_incumbent(three: list[Any]) -> None:
    a, b, _ = three
    ready, child = serving(SPEC, a)
    incumbent = ready.status.revision
    p = plan("q", "ns", "u", SPEC, get_release(), Observed(1, ready.status, "v1", b, child=child), now=NOW)
    # Surge: the incumbent Deployment is not applied at all; the canary comes on top, with its track label
    assert kinds(p) == [("Service", "q"), ("PodDisruptionBudget", "q"), ("Deployment", "q-canary")]
    canary = p.children[-1] if p.children else {}
    assert canary["spec"]["replicas"] == 1
    assert canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] == "canary"
    candidate = canary["metadata"]["annotations"][REVISION_LABEL]
    assert candidate != incumbent
    service = p.children[0] if p.children else {}
    assert TRACK_LABEL not in service["spec"]["selector"]  # both tracks behind the Service
    # the status stays the incumbent's until promotion
    assert p.status.revision == incumbent
    assert p.status.draft_revision == a.checkpoint.revision
    assert p.status.canary is not None
    assert p.status.canary.state == "Analyzing"
    assert p.status.canary.candidate.revision == candidate
    assert p.status.canary.candidate.draft_revision == b.checkpoint.revision
    assert conds(p.status)["DraftCurrent"] == ("False", "CanaryAnalyzing")
    assert conds(p.status)["Ready"] == ("True", "Ready")
    assert [e[1] for e in p.events] == ["CanaryStarted"]
    health = deployment_health(p.status, now=NOW)
    assert conds(health)["Reconciling"] == ("True", "CanaryAnalyzing")
    assert blocked(health) is not None  # no tuning rollout during a canary
    # the next pass keeps it: the same status, no event, the same children
    again = plan("q", "ns", "u", SPEC, get_release(), Observed(1, p.status, "v1", b, child=child), now=NOW)
    assert again.status == p.status
    assert again.events == []
    assert kinds(again) == kinds(p)


def test_a_rejected_draft_leaves_the_incumbent_and_is_not_tried_again(three: list[Any]) -> None:
    a, b, c = three
    ready, child = serving(SPEC, a)
    started = plan("q", "ns", "u", SPEC, get_release(), Observed(1, ready.status, "v1", b, child=child), now=NOW)
    judged, events, verdict = canaries.judge_intervals(
        SPEC, started.status, (measured(0, 0.4, 0.7), measured(5, 0.41, 0.69)), datetime(2099, 1, 1, 0, 10, tzinfo=UTC)
    )
    assert verdict == "RolledBack"
    assert judged is not None
    assert [(e[0], e[1]) for e in events] == [("Warning", "CanaryRejected")]
    held = plan("q", "ns", "u", SPEC, get_release(), Observed(1, judged, "v1", b, child=child), now=NOW)
    assert ("apps/v1", "Deployment", "q-canary") in held.prune
    assert ("Deployment", "q-canary") not in kinds(held)
    assert ("Deployment", "q") not in kinds(held)  # no rollout at all
    assert held.status.revision == ready.status.revision
    assert conds(held.status)["DraftCurrent"] == ("False", "CanaryRejected")
    said = next(x.message for x in held.status.conditions if x.type == "DraftCurrent")
    assert "0.41" in said
    assert "0.69" in said  # both figures
    health = deployment_health(held.status, now=NOW)
    assert conds(health)["Ready"] == ("True", "Ready")
    assert "Reconciling" not in conds(health)
    assert "Stalled" not in conds(health)
    again = plan("q", "ns", "u", SPEC, get_release(), Observed(1, held.status, "v1", b, child=child), now=NOW)
    assert again.status == held.status
    assert ("Deployment", "q-canary") not in kinds(again)
    # a spec edit may try the same draft again, and so may a different draft
    edited = plan("q", "ns", "u", SPEC, get_release(), Observed(2, held.status, "v1", b, child=child), now=NOW)
    assert ("Deployment", "q-canary") in kinds(edited)
    assert edited.status.canary is not None
    assert edited.status.canary.state == "Analyzing"
    other = plan("q", "ns", "u", SPEC, get_release(), Observed(1, held.status, "v1", c, child=child), now=NOW)
    assert other.status.canary is not None
    assert other.status.canary.candidate.draft_revision == c.checkpoint.revision
    # a verifier change rolls as ever, the rejected draft with it (the rejection was against the old verifier)
    verifier = plan("q", "ns", "u", SPEC, get_release(), Observed(1, held.status, "v2", b, child=child), now=NOW)
    main = next(x for x in verifier.children or [] if (x["kind"], x["metadata"]["name"]) == ("Deployment", "q"))
    assert main["metadata"]["annotations"][REVISION_LABEL] == verifier.status.revision != held.status.revision
    assert verifier.status.verifier_revision == "v2"
    assert verifier.status.draft_revision == b.checkpoint.revision


def test_a_promoted_draft_rolls_once_through_the_main_deployment_and_the_canary_goes_when_it_serves(
    three: list[Any],
) -> None:
    a, b, _ = three
    ready, child = serving(SPEC, a)
    started = plan("q", "ns", "u", SPEC, get_release(), Observed(1, ready.status, "v1", b, child=child), now=NOW)
    assert started.status.canary is not None
    candidate = started.status.canary.candidate.revision
    judged, events, verdict = canaries.judge_intervals(
        SPEC,
        started.status,
        tuple(measured(5 * i, 0.7, 0.7) for i in range(3)),
        datetime(2099, 1, 1, 0, 15, tzinfo=UTC),
    )
    assert verdict == "Promoted"
    assert judged is not None
    assert [e[1] for e in events] == ["CanaryPromoted"]
    rolling = plan("q", "ns", "u", SPEC, get_release(), Observed(1, judged, "v1", b, child=child), now=NOW)
    main = next(x for x in rolling.children or [] if (x["kind"], x["metadata"]["name"]) == ("Deployment", "q"))
    assert main["metadata"]["annotations"][REVISION_LABEL] == candidate
    assert main["spec"]["replicas"] == 2
    assert rolling.status.revision == candidate
    assert rolling.prune == []  # the canary serves until the promoted revision does
    assert conds(deployment_health(rolling.status, now=NOW))["Reconciling"] == ("True", "RollingOut")
    done = plan("q", "ns", "u", SPEC, get_release(), Observed(1, rolling.status, "v1", b, child=live(rolling)), now=NOW)
    assert done.status.canary is not None
    assert done.status.canary.state == "Promoted"
    assert ("apps/v1", "Deployment", "q-canary") in done.prune
    assert conds(done.status)["DraftCurrent"] == ("True", "RevisionResolved")
    assert "Reconciling" not in conds(deployment_health(done.status, now=NOW))


def test_in_place_scales_the_live_incumbent_without_rolling_it_and_restores_it(three: list[Any]) -> None:
    a, b, _ = three
    ready, child = serving(IN_PLACE, a)
    p = plan("q", "ns", "u", IN_PLACE, get_release(), Observed(1, ready.status, "v1", b, child=child), now=NOW)
    main = next(x for x in p.children or [] if (x["kind"], x["metadata"]["name"]) == ("Deployment", "q"))
    assert main["spec"]["replicas"] == 1
    assert main["spec"]["template"] == child["spec"]["template"]  # nothing rolls
    assert main["metadata"]["annotations"][REVISION_LABEL] == ready.status.revision
    assert p.status.replicas == 1  # the incumbent's share, so it stays Ready
    assert conds(p.status)["Ready"] == ("True", "Ready")
    judged, _, _ = canaries.judge_intervals(
        IN_PLACE, p.status, (measured(0, 0.3, 0.7), measured(5, 0.3, 0.7)), datetime(2099, 1, 1, 0, 10, tzinfo=UTC)
    )
    assert judged is not None
    back = plan("q", "ns", "u", IN_PLACE, get_release(), Observed(1, judged, "v1", b, child=child), now=NOW)
    main = next(x for x in back.children or [] if (x["kind"], x["metadata"]["name"]) == ("Deployment", "q"))
    assert main["spec"]["replicas"] == 2
    assert main["spec"]["template"] == child["spec"]["template"]


def test_a_verifier_change_or_a_newer_draft_ends_the_canary(three: list[Any]) -> None:
    a, b, c = three
    ready, child = serving(SPEC, a)
    started = plan("q", "ns", "u", SPEC, get_release(), Observed(1, ready.status, "v1", b, child=child), now=NOW)
    newer = plan("q", "ns", "u", SPEC, get_release(), Observed(1, started.status, "v1", c, child=child), now=NOW)
    assert [e[1] for e in newer.events] == ["CanaryEnded", "CanaryStarted"]
    assert newer.status.canary is not None
    assert newer.status.canary.candidate.draft_revision == c.checkpoint.revision
    assert newer.status.canary.counts.passed == 0
    assert newer.status.revision == ready.status.revision
    # a spec edit mid-canary starts it over under the new generation, with fresh counts
    judged, _, _ = canaries.judge_intervals(
        SPEC, started.status, (measured(0, 0.7, 0.7),), datetime(2099, 1, 1, 0, 5, tzinfo=UTC)
    )
    assert judged is not None
    assert judged.canary is not None
    assert judged.canary.counts.passed == 1
    edited = plan("q", "ns", "u", SPEC, get_release(), Observed(2, judged, "v1", b, child=child), now=NOW)
    assert [e[1] for e in edited.events] == ["CanaryEnded", "CanaryStarted"]
    assert edited.status.canary is not None
    assert edited.status.canary.generation == 2
    assert edited.status.canary.counts.passed == 0
    assert ("Deployment", "q-canary") in kinds(edited)
    verifier = plan("q", "ns", "u", SPEC, get_release(), Observed(1, started.status, "v2", b, child=child), now=NOW)
    assert verifier.status.canary is None
    assert ("apps/v1", "Deployment", "q-canary") in verifier.prune
    assert "CanaryEnded" in [e[1] for e in verifier.events]
    main = next(x for x in verifier.children or [] if (x["kind"], x["metadata"]["name"]) == ("Deployment", "q"))
    assert main["metadata"]["annotations"][REVISION_LABEL] == verifier.status.revision != ready.status.revision


def test_without_a_policy_a_new_draft_rolls_as_before(three: list[Any]) -> None:
    a, b, _ = three
    plain = SpeculatorDeploymentSpec.model_validate({k: v for k, v in RAW.items() if k != "upgradePolicy"})
    ready, child = serving(plain, a)
    p = plan("q", "ns", "u", plain, get_release(), Observed(1, ready.status, "v1", b, child=child), now=NOW)
    assert p.status.canary is None
    assert ("Deployment", "q-canary") not in kinds(p)
    assert p.status.draft_revision == b.checkpoint.revision
