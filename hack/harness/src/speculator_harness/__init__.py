"""A real local cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake GPU
nodes), an S3 protocol server, and — where this machine allows — one real node (containerd, kubelet,
kube-proxy, cluster DNS) running the images hack/build-images built. One module per component.

Used by the test suite (one cluster per session) and by `hack/dev-cluster up|down`.
"""

from speculator_harness.cluster import (
    ClusterInfo,
    ComponentError,
    LocalCluster,
    S3Info,
    stop_recorded,
)

__all__ = ["ClusterInfo", "ComponentError", "LocalCluster", "S3Info", "stop_recorded"]
