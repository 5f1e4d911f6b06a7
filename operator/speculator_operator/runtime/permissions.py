"""What the operator's identity must be allowed, asked of the API server once at start
(SelfSubjectAccessReview, which every authenticated user may create): a kubeconfig or service account
that lacks a verb gets one clear error naming every missing verb and resource, not a loop of 403s in
kopf's retries. The chart's rbac.yaml grants exactly this table (tests/unit/test_permissions.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client

from speculator_operator.api.common import GROUP

READ = ("get", "list", "watch")
WRITE = ("create", "patch", "update")

# (API group, resource, verbs) in every watched namespace
NEEDED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # no spec is written by the operator (a train job's hand-off lives in the deployment's status): read only, and
    # create for the train jobs a retraining starts
    (GROUP, "speculatordeployments", READ),
    (GROUP, "speculatortrainjobs", (*READ, "create")),
    (GROUP, "speculatordeployments/status", ("get", "patch", "update")),
    (GROUP, "speculatortrainjobs/status", ("get", "patch", "update")),
    ("batch", "jobs", (*READ, *WRITE)),
    ("", "pods", READ),
    ("", "pods/log", ("get",)),  # a running stage's progress line (read only: no right on the pod itself)
    ("", "persistentvolumeclaims", (*READ, *WRITE)),
    ("apps", "deployments", (*READ, *WRITE, "delete")),
    ("apps", "replicasets", ("list",)),
    ("", "services", (*READ, *WRITE, "delete")),
    ("policy", "poddisruptionbudgets", (*READ, *WRITE, "delete")),
    # spec.learning's capture settings, one ConfigMap per deployment: read by name and applied (no watch)
    ("", "configmaps", ("get", *WRITE, "delete")),
    # multi-node servers' groups: read in each pass (a deployment's by name, a train job's servers by label; no
    # watch: the API may be missing), applied, deleted after a layout change or when a train job's stage is done
    ("leaderworkerset.x-k8s.io", "leaderworkersets", ("get", "list", "create", "patch", "delete")),
    ("", "secrets", ("get",)),
    # create: every Event is posted new, by the operator's recorder and by kopf (neither patches one);
    # list: a stage Job's FailedCreate (its pods refused)
    ("", "events", ("create", "list")),
)
# watching every namespace only: kopf follows the CRDs as they change (with named namespaces it scans
# nothing cluster-wide, and a Role per namespace is all the operator gets)
CLUSTER_WIDE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
)
# where the replicas elect their leader
LEASES: tuple[str, str, tuple[str, ...]] = ("coordination.k8s.io", "leases", ("get", "create", "update"))
# the other releases' operators' Leases (runtime/peers.py): in every namespace for an all-namespaces operator, else
# in its Lease's namespace and the ones it watches
PEER_LEASES: tuple[str, str, tuple[str, ...]] = ("coordination.k8s.io", "leases", ("list",))


@dataclass(frozen=True)
class Check:
    group: str
    resource: str  # "deployments" or "speculatordeployments/status"
    verb: str
    namespace: str  # "" for all namespaces (or a cluster-scoped resource)

    def __str__(self) -> str:
        resource = f"{self.resource.split('/')[0]}.{self.group}" if self.group else self.resource.split("/")[0]
        sub = f"/{self.resource.split('/')[1]}" if "/" in self.resource else ""
        where = f"in namespace {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {resource}{sub} {where}"


def checks(namespaces: list[str], lease_namespace: str | None) -> list[Check]:
    """Every (verb, resource, namespace) the operator uses, watching `namespaces` ([] for all of them) and
    electing its leader in `lease_namespace` (None without election)."""
    scopes = namespaces or [""]
    out = [Check(g, r, v, ns) for ns in scopes for g, r, verbs in NEEDED for v in verbs]
    if not namespaces:
        out += [Check(g, r, v, "") for g, r, verbs in CLUSTER_WIDE for v in verbs]
    if lease_namespace is not None:
        g, r, verbs = LEASES
        out += [Check(g, r, v, lease_namespace) for v in verbs]
        g, r, verbs = PEER_LEASES
        where = sorted({lease_namespace, *namespaces}) if namespaces else [""]
        out += [Check(g, r, v, ns) for ns in where for v in verbs]
    return out


def missing(api: client.ApiClient, wanted: list[Check]) -> list[Check]:
    """The checks the API server denies the caller."""
    authz = client.AuthorizationV1Api(api)
    denied = []
    for check in wanted:
        resource, _, sub = check.resource.partition("/")
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    group=check.group,
                    resource=resource,
                    subresource=sub or None,
                    verb=check.verb,
                    namespace=check.namespace or None,
                )
            )
        )
        result = authz.create_self_subject_access_review(review)
        if not (result.status and result.status.allowed):
            denied.append(check)
    return denied


def refusal(denied: list[Check]) -> str:
    first, rest = denied[0], denied[1:]
    more = f" (and {len(rest)} more: {'; '.join(str(c) for c in rest[:12])}{' ...' if len(rest) > 12 else ''})"
    return (
        f"speculator-operator: not allowed to {first}{more if rest else ''}; "
        "grant it to the operator's identity (the chart's rbac.yaml lists every rule it needs)"
    )
