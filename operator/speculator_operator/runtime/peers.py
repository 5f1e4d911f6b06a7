"""Two operators must not reconcile the same objects. Each elected operator's Lease says what it watches (a label
that finds it, an annotation with its namespaces, `*` for all); the new holder of a Lease, before it starts its
controllers, lists the other operators' Leases it may read and refuses to start (exit 5) when a live one watches
an overlapping scope and the rule below gives that one the objects.

Who keeps the objects is decided the same way by both sides, so two operators never both refuse: a release that
watches named namespaces wins over one that watches all of them (it cannot see the all-namespaces one's Lease
outside its namespaces, so only the all-namespaces one can act on the overlap), and otherwise the release whose
Lease was created first wins. What each may read: an all-namespaces operator lists Leases in every namespace and
sees every other release; a namespaced one lists them in its own namespace and the ones it watches
(docs/operations/install.md, "Side by side")."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("speculator_operator.peers")

LEASE_LABEL = "speculators.dev/operator-lease"  # "true" on every elected operator's Lease
SCOPE_ANNOTATION = "speculators.dev/watch-namespaces"  # "*" or the watched namespaces, comma-separated
ALL = "*"
EXIT_OVERLAP = 5  # another release's operator watches the same objects


@dataclass(frozen=True)
class Peer:
    """An elected operator as its Lease shows it."""

    namespace: str
    name: str
    scope: frozenset[str] | None  # None: every namespace
    created: datetime | None
    holder: str
    renewed: datetime | None
    duration_s: int

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def live(self, now: datetime) -> bool:
        """Held and renewed within twice its duration (a margin for clocks): a release uninstalled, or stopped
        cleanly (it hands its Lease back), no longer counts."""
        if not self.holder or self.renewed is None:
            return False
        return now - self.renewed < timedelta(seconds=2 * self.duration_s)


def scope_text(namespaces: Iterable[str]) -> str:
    names = sorted(set(namespaces))
    return ",".join(names) if names else ALL


def parse_scope(text: str | None) -> frozenset[str] | None:
    if text is None or text.strip() in ("", ALL):
        return None
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def overlap(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    return a is None or b is None or bool(a & b)


def _scope_words(scope: frozenset[str] | None) -> str:
    return "every namespace" if scope is None else "namespaces " + ", ".join(sorted(scope))


def yields_to(me: Peer, other: Peer) -> bool:
    """Whether `me` must leave the overlapping objects to `other` (both sides decide alike)."""
    if (me.scope is None) != (other.scope is None):
        return me.scope is None  # the all-namespaces one: the namespaced one may not be able to see it
    mine, theirs = me.created, other.created
    if mine is not None and theirs is not None and mine != theirs:
        return theirs < mine  # the older release keeps its objects
    return other.ref < me.ref  # the same second: an order both sides agree on


def conflicts(me: Peer, others: Iterable[Peer], now: datetime) -> list[Peer]:
    """The live operators of other releases that watch objects `me` would watch and keep them."""
    return [o for o in others if o.ref != me.ref and o.live(now) and overlap(me.scope, o.scope) and yields_to(me, o)]


def refusal(me: Peer, found: list[Peer]) -> str:
    who = "; ".join(f"the operator of Lease {o.ref} watches {_scope_words(o.scope)}" for o in found)
    return (
        f"speculator-operator: refusing to start: {who}, and this one (Lease {me.ref}) would watch "
        f"{_scope_words(me.scope)}: two operators would reconcile the same objects. Give the releases disjoint "
        "watchNamespaces, or uninstall one (docs/operations/install.md, 'Side by side')."
    )


def peer_of(lease: client.V1Lease) -> Peer:
    meta = lease.metadata or client.V1ObjectMeta()
    spec = lease.spec or client.V1LeaseSpec()
    return Peer(
        namespace=meta.namespace or "",
        name=meta.name or "",
        scope=parse_scope((meta.annotations or {}).get(SCOPE_ANNOTATION)),
        created=meta.creation_timestamp,
        holder=spec.holder_identity or "",
        renewed=spec.renew_time,
        duration_s=spec.lease_duration_seconds or 15,
    )


def visible(api: client.ApiClient, scope: frozenset[str] | None, lease_namespace: str) -> list[Peer]:
    """The operators' Leases this identity may list: every namespace's for an all-namespaces operator, else its own
    namespace's and its watched namespaces' (a namespace it may not list is skipped, said in the log)."""
    leases = client.CoordinationV1Api(api)
    selector = f"{LEASE_LABEL}=true"
    if scope is None:
        return [peer_of(x) for x in leases.list_lease_for_all_namespaces(label_selector=selector).items]
    found: list[Peer] = []
    for namespace in sorted({lease_namespace, *scope}):
        try:
            found += [peer_of(x) for x in leases.list_namespaced_lease(namespace, label_selector=selector).items]
        except ApiException as exc:
            if exc.status != 403:
                raise
            log.warning("other operators' Leases in %s: not allowed to list them; not checked there", namespace)
    return found
