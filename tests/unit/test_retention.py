"""Retention of published checkpoints: the newest stay, and so does anything the cluster still names."""

from __future__ import annotations

from typing import Any

from speculator_operator.planning.retention import Published, prunable, references, retention_due

OUT = "s3://drafts/qwen"


def loc(n: int) -> Published:
    return Published(f"{OUT}/sha256-{n:016x}", f"2026-11-{n:02d}T00:00:00Z")


def test_the_newest_stay_and_named_ones_are_never_deleted() -> None:
    locations = [loc(n) for n in (3, 1, 5, 2, 4)]  # any listing order
    delete, kept = prunable(locations, set(), keep=2)
    assert delete == [loc(n).uri for n in (1, 2, 3)]
    assert kept == []
    delete, kept = prunable(locations, {loc(1).uri + "/", loc(5).uri}, keep=2)
    assert delete == [loc(n).uri for n in (2, 3)]
    assert kept == [loc(1).uri]
    assert prunable(locations, set(), keep=10) == ([], [])


def test_references_come_from_replicasets_jobs_deployments_and_the_pointer() -> None:
    rs: dict[str, Any] = {
        "spec": {
            "template": {
                "metadata": {"annotations": {"speculators.dev/draft-location": loc(1).uri}},
                # what a container's arguments say is not read: the annotation is the field
                "spec": {"initContainers": [{"name": "stage-draft", "args": ["stage", loc(2).uri, "/models/d"]}]},
            }
        }
    }
    job = {"status": {"checkpoint": {"uri": loc(4).uri}}}
    sdep = {"spec": {"speculator": {"source": loc(5).uri}}, "status": {"draftSource": loc(6).uri}}
    found = references([rs], [job, {}], [sdep, {}], loc(7).uri)
    assert found == {loc(n).uri for n in (1, 4, 5, 6, 7)}


def test_a_replicaset_that_does_not_name_its_draft_keeps_every_older_folder() -> None:
    stage = {"args": ["stage", loc(3).uri + "/", "/models/draft"]}
    old_rs: dict[str, Any] = {"spec": {"replicas": 0, "template": {"spec": {"initContainers": [stage]}}}}
    assert references([old_rs], [], [], None) is None


def test_retention_runs_once_and_only_for_s3() -> None:
    assert retention_due(2, OUT, {})
    assert not retention_due(2, OUT, {"retention": {"keepLatest": 2}})
    assert not retention_due(None, OUT, {})
    assert not retention_due(2, "pvc://c/p", {})
