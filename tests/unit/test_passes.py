"""Which steps a SpeculatorDeployment's pass runs for its causes (planning/passes.py)."""

from __future__ import annotations

from speculator_operator.planning.passes import (
    DEPLOYMENT_QUICK,
    TRAINJOB_QUICK,
    Cause,
    Step,
    deployment_steps,
    refresh_cause,
    trainjob_progress_only,
)


def steps(*causes: Cause, moved: bool = False, tuned: bool = False, pinned: bool = False,
          restoring: bool = False, valid: bool = True) -> tuple[Step | None, bool, str]:  # fmt: skip
    s = deployment_steps(set(causes), moved=moved, tuned=tuned, pinned=pinned, restoring=restoring, valid=valid)
    return s.main, s.refresh, s.cause


def test_a_new_generation_or_a_full_cause_reconciles_and_reads_the_child_itself() -> None:
    assert steps(Cause.CHILD, moved=True) == (Step.RECONCILE, False, "reconcile")
    assert steps(Cause.RETRY, Cause.RESYNC) == (Step.RECONCILE, False, "reconcile")
    assert steps(Cause.TRAINJOB) == (Step.RECONCILE, False, "trainjob")
    assert steps(Cause.TRAINJOB, Cause.SPEC) == (Step.RECONCILE, False, "reconcile")
    assert steps(Cause.SCRAPE, tuned=True) == (Step.RECONCILE, False, "tuning")


def test_a_standing_drift_turns_the_reconcile_into_a_restoration() -> None:
    assert steps(Cause.DRIFT, restoring=True) == (Step.RESTORE, False, "restore")
    assert steps(Cause.SPEC, Cause.DRIFT, restoring=True) == (Step.RESTORE, False, "reconcile")
    # a drift whose child, read again, is ours (a stale event) only refreshes the counts
    assert steps(Cause.DRIFT) == (None, True, "")


def test_a_pinned_pair_is_not_reconciled_until_its_retrain_hands_over() -> None:
    assert steps(Cause.SPEC, moved=True, pinned=True) == (None, False, "")
    assert steps(Cause.CHILD, Cause.RETRY, pinned=True) == (None, True, "")


def test_the_poll_runs_only_when_nothing_reconciles_and_the_spec_is_valid() -> None:
    assert steps(Cause.POLL) == (Step.POLL, False, "poll")
    assert steps(Cause.POLL, Cause.CHILD) == (Step.POLL, True, "poll")
    assert steps(Cause.POLL, Cause.SPEC) == (Step.RECONCILE, False, "reconcile")
    assert steps(Cause.POLL, valid=False) == (None, False, "")
    assert steps(Cause.RESYNC, valid=False) == (None, False, "")


def test_a_scrape_alone_changes_no_child_and_reads_none() -> None:
    assert steps(Cause.SCRAPE) == (None, False, "")


def test_the_refresh_is_counted_as_a_resync_only_when_that_is_all_it_was_for() -> None:
    assert refresh_cause({Cause.RESYNC}) == "resync"
    assert refresh_cause({Cause.RESYNC, Cause.SCRAPE}) == "resync"
    assert refresh_cause({Cause.RESYNC, Cause.CHILD}) == "child"
    assert refresh_cause({Cause.DRIFT}) == "child"


def test_quick_causes_never_include_one_that_reads_inputs() -> None:
    slow = {Cause.SPEC, Cause.RETRY, Cause.TRAINJOB, Cause.POLL, Cause.DRIFT}
    assert not (DEPLOYMENT_QUICK | TRAINJOB_QUICK) & slow
    assert trainjob_progress_only({Cause.PROGRESS})
    assert not trainjob_progress_only({Cause.PROGRESS, Cause.CHILD})


def test_a_resume_request_reconciles_and_a_resolve_request_polls_now() -> None:
    def asked(*causes: Cause, **kw: bool) -> tuple[Step | None, str]:
        s = deployment_steps(set(causes), moved=False, tuned=False, pinned=kw.pop("pinned", False), restoring=False,
                             valid=True, **kw)  # fmt: skip
        return s.main, s.cause

    assert asked(Cause.REQUEST, resume=True) == (Step.RECONCILE, "request")
    assert asked(Cause.REQUEST, Cause.SPEC, resume=True) == (Step.RECONCILE, "reconcile")
    assert asked(Cause.REQUEST, resume=True, pinned=True) == (None, "")  # a retrain's pin is not a pause
    assert asked(Cause.REQUEST, resolve=True) == (Step.POLL, "request")
    assert asked(Cause.REQUEST, Cause.POLL, resolve=True) == (Step.POLL, "poll")
    assert asked(Cause.REQUEST) == (None, "")  # a request already acted on: nothing
