"""kwok: fake nodes and the pod life cycles it plays on them (kwok-stages.yaml): `kwok-cpu-*` (no GPUs,
untainted) and `kwok-gpu-*` (nvidia.com/gpu, the GPU product labels and the taint GPU pools carry)."""

from __future__ import annotations

import urllib.error
from importlib import resources
from pathlib import Path
from typing import Any

from speculator_harness.apiserver import Api
from speculator_harness.process import LOOPBACK, ComponentError, Supervisor, http_get

# Fake GPU nodes: what the NVIDIA device plugin and GPU feature discovery would publish.
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
FAKE_POD_CIDR = "10.244.0.0/16"  # data only: nothing answers on these addresses


def start(sup: Supervisor, kubeconfig: Path) -> None:
    stages = sup.workdir / "kwok-stages.yaml"
    stages.write_text(resources.files(__package__).joinpath("kwok-stages.yaml").read_text())
    key, value = FAKE_NODE_ANNOTATION

    def argv() -> list[str]:
        return [
            sup.bin("kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--server-address={LOOPBACK}:{sup.port('kwok')}",
            "--node-lease-duration-seconds=40",
            f"--cidr={FAKE_POD_CIDR}",
            "--node-ip=10.0.0.2",
        ]

    def ready() -> bool:
        return http_get(f"http://{LOOPBACK}:{sup.ports['kwok']}/healthz", None).strip() == "ok"

    sup.launch("kwok", argv, ready)


def node(name: str, gpus: int, gpu_product: str) -> dict[str, Any]:
    key, value = FAKE_NODE_ANNOTATION
    resources_ = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "2Ti"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    spec: dict[str, Any] = {}
    if gpus:
        resources_[GPU_RESOURCE] = str(gpus)
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": gpu_product,
                "nvidia.com/gpu.count": str(gpus),
            }
        )
        spec["taints"] = [GPU_TAINT]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": spec,
        "status": {"allocatable": resources_, "capacity": resources_},
    }


def node_names(cpu_nodes: int, gpu_nodes: int) -> list[str]:
    return [f"kwok-cpu-{i}" for i in range(cpu_nodes)] + [f"kwok-gpu-{i}" for i in range(gpu_nodes)]


def create_nodes(api: Api, names: list[str], gpus_per_node: int, gpu_product: str) -> None:
    for name in names:
        body = node(name, gpus_per_node if name.startswith("kwok-gpu") else 0, gpu_product)
        try:
            api.call("POST", "/api/v1/nodes", body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise ComponentError("kube-apiserver", f"creating node {name}: {exc}") from exc
