"""The executor (runtime/executor.py) against a fake client below it: each write's outcome, the order of the
writes, what stops the rest, and the events posted at the end of the pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from kubernetes.client.exceptions import ApiException

from speculator_operator.planning.writes import Apply, Create, Delete, DeleteFolders, Writes
from speculator_operator.runtime import executor as ex
from speculator_operator.runtime import kube

BODY = {"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment",
        "metadata": {"namespace": "ns", "name": "pair", "uid": "u1"}}  # fmt: skip
CHILD = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": "ns", "name": "pair"}}


def refusal(status: int, reason: str, message: str, causes: list[dict[str, str]] | None = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"message": message, "details": {"causes": causes or []}})
    return exc


class Fake:
    """The API server below the executor: what it was asked, in order, and what it answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.apply_error: ApiException | None = None
        self.gone: set[str] = set()  # names a delete finds absent
        self.create_error: ApiException | None = None
        self.posted: list[tuple[str, str, str]] = []

    def event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        """The event recorder's side (runtime/events.EventRecorder.event)."""
        self.posted.append((type, reason, message))

    def apply_children(self, children: list[dict[str, Any]], force: bool = False, known: Any = None) -> Any:
        self.calls.append(("apply", [c["metadata"]["name"] for c in children], force, known))
        if self.apply_error is not None:
            raise self.apply_error
        return {(c["kind"], c["metadata"]["name"]): kube.Applied(None, c) for c in children}

    def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.calls.append(("delete", kind, namespace, name))
        return name not in self.gone

    def create_custom(self, plural: str, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(("create", plural, namespace, body["metadata"]["name"]))
        if self.create_error is not None:
            raise self.create_error


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    api = Fake()
    monkeypatch.setattr(kube, "apply_children", api.apply_children)
    monkeypatch.setattr(kube, "delete_object", api.delete_object)
    monkeypatch.setattr(kube, "create_custom", api.create_custom)
    return api


def test_an_apply_goes_first_then_the_deletes_and_creates_and_the_events_are_said_at_the_end(fake: Fake) -> None:
    hooked: list[tuple[str, str]] = []
    run = ex.Executor(BODY, lambda namespace, name: hooked.append((namespace, name)), recorder=fake)
    manifest = {"metadata": {"name": "pair-retrain-v2"}}
    out = run.execute(Writes(
        apply=Apply([CHILD], force=True, known={("Deployment", "pair"): None}),
        deletes=(Delete("apps/v1", "Deployment", "pair-canary"), Delete("v1", "Service", "gone")),
        creates=(Create("speculatortrainjobs", manifest),),
        events=(("Normal", "RollingOut", "applying revision r1"),),
    ))  # fmt: skip
    assert hooked == [("ns", "pair")]  # the controller's on_apply extension point, just before the apply
    assert [c[0] for c in fake.calls] == ["apply", "delete", "delete", "create"]
    assert fake.calls[0] == ("apply", ["pair"], True, {("Deployment", "pair"): None})
    assert isinstance(out.apply, ex.Applied)
    assert list(out.applied) == [("Deployment", "pair")]
    assert out.created == [ex.Created("pair-retrain-v2")]
    assert not out.stopped
    assert fake.posted == []  # nothing is posted before the end of the pass
    run.say(("Warning", "Other", "x" * 2000))
    run.post()
    assert fake.posted[0] == ("Normal", "RollingOut", "applying revision r1")
    assert fake.posted[1][:2] == ("Warning", "Other")
    assert len(fake.posted[1][2]) == 1024
    run.post()
    assert len(fake.posted) == 2  # each event once


def test_a_delete_that_finds_nothing_is_not_found(fake: Fake) -> None:
    fake.gone.add("old")
    out = ex.Executor(BODY, recorder=fake).execute(Writes(deletes=(Delete("apps/v1", "Deployment", "old"),
                                                    Delete("v1", "Service", "pair"))))  # fmt: skip
    assert out.deleted == [ex.NotFound(Delete("apps/v1", "Deployment", "old")),
                           ex.Deleted(Delete("v1", "Service", "pair"))]  # fmt: skip


def test_a_refused_apply_says_the_apis_answer_and_stops_the_rest(fake: Fake) -> None:
    fake.apply_error = refusal(422, "Unprocessable Entity", "spec.replicas: Invalid value")
    run = ex.Executor(BODY, recorder=fake)
    out = run.execute(Writes(apply=Apply([CHILD]), deletes=(Delete("apps/v1", "Deployment", "x"),),
                             events=(("Normal", "RollingOut", "r1"),)))  # fmt: skip
    assert out.apply == ex.Refused(422, "Unprocessable Entity", "spec.replicas: Invalid value")
    assert out.apply.message == ("applying the children failed: 422 Unprocessable Entity: spec.replicas: Invalid value")
    assert out.stopped
    assert [c[0] for c in fake.calls] == ["apply"]  # no delete after a refused apply
    run.post()
    assert fake.posted == []  # the plan's events are not said


def test_an_apply_into_a_namespace_being_deleted_is_terminating(fake: Fake) -> None:
    fake.apply_error = refusal(403, "Forbidden", "namespace is being terminated",
                               [{"reason": "NamespaceTerminating"}])  # fmt: skip
    out = ex.Executor(BODY, recorder=fake).execute(
        Writes(apply=Apply([CHILD]), deletes=(Delete("v1", "Service", "x"),))
    )
    assert out.apply == ex.Terminating()
    assert out.stopped
    assert [c[0] for c in fake.calls] == ["apply"]


def test_no_children_is_no_apply(fake: Fake) -> None:
    out = ex.Executor(BODY, recorder=fake).execute(Writes(apply=Apply([])))
    assert out.apply is None
    assert fake.calls == []


def test_a_create_that_exists_already_is_a_conflict_and_any_other_refusal_is_raised(fake: Fake) -> None:
    create = Create("speculatortrainjobs", {"metadata": {"name": "pair-retrain-v2"}})
    fake.create_error = refusal(409, "Conflict", "already exists")
    assert ex.Executor(BODY, recorder=fake).execute(Writes(creates=(create,))).created == [
        ex.Conflict("pair-retrain-v2")
    ]
    fake.create_error = refusal(403, "Forbidden", "no")
    with pytest.raises(ApiException):
        ex.Executor(BODY, recorder=fake).execute(Writes(creates=(create,)))


class FakeS3:
    def __init__(self, keys: list[str], fail: bool = False) -> None:
        self.keys, self.fail = keys, fail
        self.deleted: list[str] = []

    def get_paginator(self, _: str) -> Any:
        keys = self.keys

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                return [{"Contents": [{"Key": k} for k in keys if k.startswith(Prefix)]}]

        return Pages()

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> None:
        if self.fail:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, "DeleteObjects")
        self.deleted += [o["Key"] for o in Delete["Objects"]]

    def delete_object(self, Bucket: str, Key: str) -> None:
        self.deleted.append(Key)


def test_folders_are_deleted_their_provenance_record_last(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    s3 = FakeS3(["out/sha256-a/model.safetensors", "out/sha256-a/speculators-provenance.json", "out/keep/x"])
    monkeypatch.setattr(ex, "s3_client", lambda creds: s3)
    monkeypatch.setattr(ex, "PROVENANCE", "speculators-provenance.json")
    run = ex.Executor(BODY, recorder=fake)
    out = run.execute(Writes(folders=DeleteFolders(("s3://b/out/sha256-a",), {"AWS_ACCESS_KEY_ID": "k"}),
                             events=(("Normal", "Pruned", "deleted 1"),)))  # fmt: skip
    assert out.folders == ex.FoldersDeleted(("s3://b/out/sha256-a",))
    assert s3.deleted == ["out/sha256-a/model.safetensors", "out/sha256-a/speculators-provenance.json"]
    run.post()
    assert fake.posted == [("Normal", "Pruned", "deleted 1")]


def test_a_folder_delete_s3_refuses_stops_and_says_why(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "s3_client", lambda creds: FakeS3(["out/sha256-a/m"], fail=True))
    run = ex.Executor(BODY, recorder=fake)
    out = run.execute(Writes(folders=DeleteFolders(("s3://b/out/sha256-a",)), events=(("Normal", "Pruned", "x"),)))
    assert isinstance(out.folders, ex.FoldersFailed)
    assert "AccessDenied" in out.folders.error
    assert out.stopped
    run.post()
    assert fake.posted == []
