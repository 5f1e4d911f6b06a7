"""The operator's own metrics about its work: reconcile outcomes and durations, audits by rule, stage
durations from the stage rows a pass wrote."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import kopf
import pytest
from prometheus_client import REGISTRY

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.domain.releases import get_release
from speculator_operator.runtime import metrics

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_reconciles_are_counted_and_timed_by_outcome() -> None:
    before = {o: value("speculator_reconciles_total", kind="Test", outcome=o) for o in ("ok", "retry", "error")}
    with metrics.reconciling("Test"):
        pass
    with pytest.raises(kopf.TemporaryError), metrics.reconciling("Test"):
        raise kopf.TemporaryError("waiting", delay=1)
    with pytest.raises(RuntimeError), metrics.reconciling("Test"):
        raise RuntimeError("boom")
    for outcome in ("ok", "retry", "error"):
        assert value("speculator_reconciles_total", kind="Test", outcome=outcome) == before[outcome] + 1
    assert value("speculator_reconcile_duration_seconds_count", kind="Test", outcome="ok") >= 1


def test_audits_count_their_findings_by_rule(tmp_path: Path) -> None:
    config, tensors = eagle3()
    tensors["fc.weight"] = ("BF16", [4096, 4096])
    write_checkpoint(tmp_path / "bad", config, tensors)
    report = audit(str(tmp_path / "bad"), verifier=QWEN3_8B, release=get_release())
    assert not report.ok
    rule = report.errors[0].rule
    failed = value("speculator_audits_total", kind="SpeculatorDeployment", outcome="failed")
    found = value("speculator_audit_findings_total", rule=rule, severity="error")
    metrics.audited("SpeculatorDeployment", report)
    assert value("speculator_audits_total", kind="SpeculatorDeployment", outcome="failed") == failed + 1
    assert value("speculator_audit_findings_total", rule=rule, severity="error") >= found + 1


def test_stage_durations_come_from_the_stages_that_finished_in_this_pass() -> None:
    old = [
        {
            "name": "fetch",
            "phase": "Succeeded",
            "startTime": "2026-01-01T00:00:00Z",
            "completionTime": "2026-01-01T00:00:05Z",
        },
        {"name": "prepare", "phase": "Running", "startTime": "2026-01-01T00:00:06Z"},
    ]
    new = [
        old[0],
        {
            "name": "prepare",
            "phase": "Succeeded",
            "startTime": "2026-01-01T00:00:06Z",
            "completionTime": "2026-01-01T00:01:06Z",
        },
        {
            "name": "audit",
            "phase": "Failed",
            "startTime": "2026-01-01T00:01:07Z",
            "completionTime": "2026-01-01T00:01:10Z",
        },
        {"name": "publish", "phase": "Pending"},
    ]
    assert metrics.finished_stages(old, new) == [("prepare", "succeeded", 60.0), ("audit", "failed", 3.0)]
    assert metrics.finished_stages(new, new) == []  # a pass that changed nothing observes nothing
    audits = value("speculator_audits_total", kind="SpeculatorTrainJob", outcome="failed")
    metrics.stages_finished(old, new)
    assert value("speculator_trainjob_stage_duration_seconds_sum", stage="prepare", outcome="succeeded") >= 60.0
    assert value("speculator_audits_total", kind="SpeculatorTrainJob", outcome="failed") == audits + 1


def test_a_pool_wait_is_the_time_from_submitting_until_a_thread_starts_the_work() -> None:
    from concurrent.futures import ThreadPoolExecutor
    from threading import Event

    from speculator_operator.runtime.kube import waited

    count = "speculator_lane_wait_seconds_count"
    slow = "speculator_lane_wait_seconds_bucket"
    before = value(count, lane="test"), value(slow, lane="test", le="0.05")
    release = Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        busy = pool.submit(release.wait)  # the only thread is taken
        queued = pool.submit(waited("test", lambda x: x * 2), 21)
        assert not release.wait(0.3)  # held for 0.3 s before the queued work can start
        release.set()
        busy.result()
        assert queued.result() == 42
    assert value(count, lane="test") == before[0] + 1
    assert value(slow, lane="test", le="0.05") == before[1]  # it waited longer than 50 ms: not in that bucket


def test_the_live_blocks_leave_out_garbage_that_awaits_the_collector() -> None:
    """Cycles nobody refers to any more are not live: the gauge reads what survives a full collection, so two
    readings of the same live heap agree however long ago the collector last ran."""
    gc.collect()
    live = value("speculator_operator_python_blocks")
    gc.disable()  # as between two of Python's own full passes: the garbage stays allocated
    try:
        for _ in range(20_000):
            cycle: list[object] = []
            cycle.append(cycle)
        del cycle
        assert sys.getallocatedblocks() > live + 15_000  # the garbage is still allocated
        after = value("speculator_operator_python_blocks")
    finally:
        gc.enable()
    assert after < live + 5_000, (live, after)
