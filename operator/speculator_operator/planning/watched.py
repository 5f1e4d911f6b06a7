"""What the watches' events carry for a SpeculatorDeployment's serving counts, so that the pass a child's event
asks for need not read the child and its pods again (pure; the event handlers and the pass are in
controllers/deployment.py and controllers/observed.py).

At 1,000 new SpeculatorDeployments each child Deployment sends five or six events while it rolls out, and each
asked for a pass that read the object, the child and (while Deploying) the pods before it wrote: half a second of
a worker each under that load, so a child's readiness waited for a worker (docs/design/runtime.md). Two rules cut
that, as controller-runtime's predicates and informer caches do:

- `serving_inputs`: the part of a child that `planning/deployment.serving_status` reads. An event that leaves it
  as it was (a condition's `lastUpdateTime`, the child's own resourceVersion) asks for no pass.
- The child as its event showed it, and its pods as the pod watch shows them at that moment (`trimmed_child`,
  `trimmed_pod`: only what the planner reads), are handed to the pass, which uses the pods only when they agree
  with the child's ready count (`pods_agree`): the two come from different watches, and a pod whose readiness
  has not reached this process yet would hide a served image or show a problem that is over. When they do not
  agree, the pass lists the pods as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from speculator_operator.api.labels import LWS_GROUP_KEY_LABEL, REVISION_LABEL, ROLE_LABEL
from speculator_operator.render.group import WORKER


class ServingInputs(NamedTuple):
    """What `serving_status` reads of a child Deployment."""

    revision: str | None
    observed: bool  # its controller has seen its generation
    replicas: int
    ready: int
    updated: int
    available: int
    failure: tuple[Any, Any, Any] | None  # a ReplicaFailure condition's status, message and reason

    def readiness(self) -> tuple[int, int]:
        """The ready and available counts: what moves the owner's Ready."""
        return self.ready, self.available


def serving_inputs(child: Mapping[str, Any]) -> ServingInputs:
    """What `serving_status` reads of a child Deployment: its revision, whether its controller has seen its
    generation, the replica counts, and a ReplicaFailure condition."""
    meta = child.get("metadata") or {}
    st = child.get("status") or {}
    failure = next((c for c in st.get("conditions") or [] if c.get("type") == "ReplicaFailure"), None)
    return ServingInputs(
        (meta.get("annotations") or {}).get(REVISION_LABEL),
        (st.get("observedGeneration") or 0) >= (meta.get("generation") or 0),
        st.get("replicas") or 0,
        st.get("readyReplicas") or 0,
        st.get("updatedReplicas") or 0,
        st.get("availableReplicas") or 0,
        (failure.get("status"), failure.get("message"), failure.get("reason")) if failure else None,
    )


def trimmed_child(child: Mapping[str, Any]) -> dict[str, Any]:
    """A child Deployment as `serving_status` reads it (no spec, no managedFields)."""
    meta = child.get("metadata") or {}
    revision = (meta.get("annotations") or {}).get(REVISION_LABEL)
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "generation") if k in meta}
    if revision is not None:
        kept["annotations"] = {REVISION_LABEL: revision}
    return {"metadata": kept, "status": dict(child.get("status") or {})}


_CONTAINER_STATUS = ("name", "ready", "image", "imageID")
# what planning/pods.py reads of a container's state and last state, and of a pod's condition: no timestamps
_STATE = {"waiting": ("reason", "message"), "terminated": ("reason", "exitCode", "message")}
_CONDITION = ("type", "status", "reason", "message")


def _state(state: Mapping[str, Any] | None, kinds: tuple[str, ...]) -> dict[str, Any]:
    state = state or {}
    return {kind: {k: state[kind][k] for k in _STATE[kind] if k in state[kind]} for kind in kinds if state.get(kind)}


def _container_status(cs: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: cs[k] for k in _CONTAINER_STATUS if k in cs}
    if state := _state(cs.get("state"), ("waiting", "terminated")):
        kept["state"] = state
    if last := _state(cs.get("lastState"), ("terminated",)):
        kept["lastState"] = last
    return kept


SCRAPE_PORT = "http"  # the serving container's port that the scrape reads /metrics from (render/serving.py)


def trimmed_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A serving pod as `first_problem`, `served_image`, `pods_agree` and `scrape_target` read it: its name,
    revision label and deletion, its containers' names, images and http port, their statuses (a waiting or
    terminated state and a terminated last state, without timestamps), its PodScheduled and Ready conditions
    (without timestamps) and its address. The one copy of each serving pod the operator keeps (the pod index,
    controllers/observed.py): the serving counts and the acceptance scrape read the same one."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    st = pod.get("status") or {}
    kept_meta: dict[str, Any] = {"name": meta.get("name")}
    labels = meta.get("labels") or {}
    kept_labels = {k: labels[k] for k in (REVISION_LABEL, ROLE_LABEL, LWS_GROUP_KEY_LABEL) if k in labels}
    if kept_labels:
        kept_meta["labels"] = kept_labels
    if meta.get("deletionTimestamp"):
        kept_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    status: dict[str, Any] = {
        "conditions": [
            {k: c[k] for k in _CONDITION if k in c}
            for c in st.get("conditions") or []
            if c.get("type") in ("PodScheduled", "Ready")
        ]
    }
    if st.get("podIP"):
        status["podIP"] = st["podIP"]
    for key in ("initContainerStatuses", "containerStatuses"):
        if st.get(key):
            status[key] = [_container_status(cs) for cs in st[key]]
    containers = []
    for c in spec.get("containers") or []:
        container = {"name": c.get("name"), "image": c.get("image")}
        ports = [{"name": p["name"], "containerPort": p.get("containerPort")}
                 for p in c.get("ports") or [] if p.get("name") == SCRAPE_PORT]  # fmt: skip
        if ports:
            container["ports"] = ports
        containers.append(container)
    return {"metadata": kept_meta, "spec": {"containers": containers}, "status": status}


def scrape_target(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A serving pod as the acceptance scrape dials it: its name, address, http port and revision."""
    meta = pod.get("metadata") or {}
    port = None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == SCRAPE_PORT:
                port = p.get("containerPort")
    return {
        "pod": meta.get("name"),
        "ip": (pod.get("status") or {}).get("podIP"),
        "port": port,
        "revision": (meta.get("labels") or {}).get(REVISION_LABEL),
    }


def whole_groups(pods: list[dict[str, Any]], revision: str | None, size: int) -> int:
    """The LeaderWorkerSet groups whose `size` pods (none being deleted) all carry `revision`. The LeaderWorkerSet
    updates a group in place, leader first, and counts it updated before its workers follow: the operator counts
    only whole groups."""
    members: dict[str, list[str | None]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        key = labels.get(LWS_GROUP_KEY_LABEL)
        if key and not meta.get("deletionTimestamp"):
            members.setdefault(key, []).append(labels.get(REVISION_LABEL))
    return sum(1 for revisions in members.values() if len(revisions) == size and set(revisions) == {revision})


def scraped(pod: Mapping[str, Any]) -> bool:
    """Whether the acceptance scrape dials this pod: every serving pod but a group's headless workers (the leader
    serves /metrics for the whole engine)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL) != WORKER


def ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod is Ready and not being deleted (as a ReplicaSet counts it, and as the scrape takes it)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pods_agree(child: Mapping[str, Any] | None, pods: list[dict[str, Any]]) -> bool:
    """Whether the pods as watched are as new as the child: as many of them ready (and not being deleted) as
    the child's `readyReplicas` counts (its ReplicaSets count the same pods)."""
    if child is None:
        return False
    return sum(1 for p in pods if ready(p)) == ((child.get("status") or {}).get("readyReplicas") or 0)
