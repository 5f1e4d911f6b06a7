"""Two releases' operators on the same objects (runtime/peers.py): the one the rule does not give them refuses to
start, both sides decide alike, and a release that stopped or was uninstalled no longer counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from speculator_operator.runtime import permissions
from speculator_operator.runtime.peers import (
    LEASE_LABEL,
    SCOPE_ANNOTATION,
    Peer,
    conflicts,
    parse_scope,
    peer_of,
    refusal,
    scope_text,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def peer(ref: str, scope: str, created_min_ago: int, renewed_s_ago: int = 1, holder: str = "pod_1") -> Peer:
    namespace, name = ref.split("/")
    return Peer(namespace, name, parse_scope(scope), NOW - timedelta(minutes=created_min_ago), holder,
                NOW - timedelta(seconds=renewed_s_ago), 15)  # fmt: skip


def refused(me: Peer, *others: Peer) -> list[str]:
    return [o.ref for o in conflicts(me, others, NOW)]


def test_of_two_all_namespaces_releases_the_younger_refuses() -> None:
    old, new = peer("a/so-a", "*", 60), peer("b/so-b", "*", 1)
    assert refused(new, old) == ["a/so-a"]
    assert refused(old, new) == []  # the older one keeps running


def test_an_all_namespaces_release_refuses_beside_a_namespaced_one_whatever_their_age() -> None:
    # the namespaced operator may not be able to see the other's Lease: the all-namespaces one acts
    everything, team = peer("ops/so", "*", 600), peer("team/so-team", "team", 1)
    assert refused(everything, team) == ["team/so-team"]
    assert refused(team, everything) == []


def test_namespaced_releases_clash_only_on_a_shared_namespace() -> None:
    a, b, c = peer("x/a", "ns1,ns2", 60), peer("x/b", "ns2,ns3", 1), peer("x/c", "ns4", 1)
    assert refused(b, a) == ["x/a"]
    assert refused(a, b) == []
    assert refused(c, a, b) == []  # disjoint: side by side
    assert refused(a, c) == []


def test_only_live_leases_of_other_releases_count() -> None:
    me = peer("b/so-b", "*", 1)
    stale = peer("a/so-a", "*", 60, renewed_s_ago=31)  # uninstalled or crashed: not renewed for 2 lease terms
    handed_back = peer("a/so-a", "*", 60, holder="")  # a clean stop hands the Lease back
    itself = peer("b/so-b", "*", 60)  # this release's own Lease (its standby reads it too)
    assert refused(me, stale, handed_back, itself) == []
    assert refused(me, peer("a/so-a", "*", 60, renewed_s_ago=29)) == ["a/so-a"]


def test_a_tie_is_broken_alike_on_both_sides() -> None:
    a, b = peer("x/a", "ns1", 5), peer("x/b", "ns1", 5)
    assert (refused(a, b), refused(b, a)) == ([], ["x/a"])


def test_the_refusal_names_both_scopes_and_what_to_do() -> None:
    me, other = peer("b/so-b", "ns1,ns2", 1), peer("a/so-a", "*", 60)
    text = refusal(me, [other])
    assert "a/so-a watches every namespace" in text
    assert "b/so-b" in text
    assert "ns1, ns2" in text
    assert "watchNamespaces" in text


def test_the_lease_carries_its_scope_and_is_read_back() -> None:
    assert scope_text([]) == "*"
    assert scope_text(["b", "a", "b"]) == "a,b"
    assert parse_scope("*") is None
    assert parse_scope("a,b") == frozenset({"a", "b"})
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="so-a", namespace="a", creation_timestamp=NOW,
                                     labels={LEASE_LABEL: "true"}, annotations={SCOPE_ANNOTATION: "ns1"}),
        spec=client.V1LeaseSpec(holder_identity="pod_1", renew_time=NOW, lease_duration_seconds=15),
    )  # fmt: skip
    assert peer_of(lease) == Peer("a", "so-a", frozenset({"ns1"}), NOW, "pod_1", NOW, 15)


@pytest.mark.parametrize("namespaces", [[], ["ns1", "ns2"]])
def test_the_operator_asks_for_the_right_to_list_the_leases_it_checks(namespaces: list[str]) -> None:
    wanted = {(c.verb, c.namespace) for c in permissions.checks(namespaces, "ops") if c.resource == "leases"}
    expected = {("list", "")} if not namespaces else {("list", "ops"), ("list", "ns1"), ("list", "ns2")}
    assert wanted == {("get", "ops"), ("create", "ops"), ("update", "ops")} | expected
