"""A real local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
(fake GPU nodes), plus an S3 protocol server, all as processes bound to 127.0.0.1.

Used by the test suite (one cluster per session) and by `hack/dev-cluster up|down`.
"""

from speculator_operator.localcluster.cluster import (
    ClusterInfo,
    ComponentError,
    LocalCluster,
    S3Info,
    stop_recorded,
)

__all__ = ["ClusterInfo", "ComponentError", "LocalCluster", "S3Info", "stop_recorded"]
