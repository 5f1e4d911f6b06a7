"""A server larger than one node as a LeaderWorkerSet (sigs.k8s.io/lws, leaderworkerset.x-k8s.io/v1): one group of
`nodes` pods per replica. The leader (worker index 0) runs vLLM's API server as node rank 0; the other pods run
headless ranks of the same engine. vLLM's own multi-node launch, without Ray (docs/reference/parallelism.md):
`--nnodes N --node-rank R --master-addr LEADER --distributed-executor-backend mp`, `--headless` on the others.

The rank and the leader's address come from the variables the LeaderWorkerSet pod webhook injects into every
container of a group (LWS_LEADER_ADDRESS, LWS_WORKER_INDEX); the kubelet expands `$(VAR)` in the arguments. Where
the webhook did not run, the reference stays unexpanded and the serve entrypoint refuses to start vLLM, saying so
(pods/serve.py): no rank ever starts with a literal `$(LWS_LEADER_ADDRESS)` for an address.
"""

from __future__ import annotations

import copy
from typing import Any

from speculator_operator.api.labels import ROLE_LABEL
from speculator_operator.domain.parallelism import Layout

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
GROUP = "leaderworkerset.x-k8s.io"
LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
WORKER_INDEX = "LWS_WORKER_INDEX"
GROUP_SIZE = "LWS_GROUP_SIZE"
LEADER, WORKER = "leader", "worker"
INSTALL_HINT = (
    "install the LeaderWorkerSet controller (https://lws.sigs.k8s.io/docs/installation/, e.g. "
    "`kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/download/v0.9.0/manifests.yaml`);"
    " the operator finds it within one resync, without a restart"
)


def group_args(layout: Layout, role: str) -> list[str]:
    """vLLM's multi-node arguments for the leader or a worker of a group (nothing for one node)."""
    if not layout.multi_node:
        return []
    rank = "0" if role == LEADER else f"$({WORKER_INDEX})"
    args = ["--nnodes", str(layout.nodes), "--node-rank", rank, "--master-addr", f"$({LEADER_ADDRESS})",
            "--distributed-executor-backend", "mp"]  # fmt: skip
    return args if role == LEADER else [*args, "--headless"]


MASTER_PORT_BASE = 29501  # vLLM's default --master-port
MASTER_PORTS = 1000


def rendezvous(layout: Layout, revision: str) -> list[str]:
    """`--master-port` derived from the revision: a LeaderWorkerSet updates a group in place (the leader first, then
    its workers' StatefulSet), so for a moment a group's pods carry two revisions; ranks of two revisions then dial
    two different ports and can never form one engine."""
    if not layout.multi_node:
        return []
    return ["--master-port", str(MASTER_PORT_BASE + int(revision, 16) % MASTER_PORTS)]


def worker_pod(leader: dict[str, Any], worker_args: list[str]) -> dict[str, Any]:
    """The worker pods' spec from the leader's: the same stage containers (each pod stages and audits the draft),
    the same command with `worker_args` (the engine's arguments with the worker's rank and --headless), and no HTTP
    probes or port (a headless rank serves no HTTP). A rank that stalls stalls the engine: the leader's /health
    fails, its liveness probe restarts it, and the group is recreated as a unit (RecreateGroupOnPodRestart)."""
    pod = copy.deepcopy(leader)
    container = pod["containers"][0]
    container["args"] = list(worker_args)
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(key, None)
    return pod


def leader_worker_set(
    meta: dict[str, Any],
    template_meta: dict[str, Any],
    leader: dict[str, Any],
    worker_args: list[str],
    layout: Layout,
    replicas: int,
) -> dict[str, Any]:
    """One LeaderWorkerSet: `replicas` groups of `layout.nodes` pods. A new template rolls whole groups (one
    surge group at a time, none taken down first: the same promise as the single-node Deployment), and any pod
    that restarts recreates its group."""

    def template(role: str, pod: dict[str, Any]) -> dict[str, Any]:
        labels = {**template_meta["labels"], ROLE_LABEL: role}
        return {"metadata": {"labels": labels, "annotations": dict(template_meta["annotations"])}, "spec": pod}

    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",  # the leader is not ready until its workers have joined
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "leaderWorkerTemplate": {
                "size": layout.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(LEADER, leader),
                "workerTemplate": template(WORKER, worker_pod(leader, worker_args)),
            },
        },
    }
