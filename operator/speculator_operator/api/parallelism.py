"""How one vLLM server (a serving replica, a train job's extraction server) is laid out over GPUs and nodes.

The layouts vLLM 0.32 launches itself, without Ray (docs/reference/parallelism.md):
- one node: tensor × pipeline × data GPUs in one pod;
- model parallel over nodes (data 1): tensor × pipeline GPUs split evenly over `nodes` pods, started with
  `--nnodes/--node-rank/--master-addr`, the other ranks `--headless`;
- data parallel over nodes (data > 1): `data / nodes` data-parallel ranks per pod, each with tensor × pipeline
  GPUs of its own node; internal load balancing (dense models refuse external load balancing).
A data-parallel rank whose model spans nodes is not offered: `data` must then be a multiple of `nodes`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from speculator_operator.api.common import Model
from speculator_operator.domain.parallelism import Layout


class Parallelism(Model):
    """Parallel sizes of one server; the GPUs of one pod are tensor × pipeline × data / nodes."""

    tensor: int | None = Field(
        default=None, ge=1, le=64, description="Tensor-parallel size (default: tensorParallelSize beside this block)."
    )
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel size (--pipeline-parallel-size).")
    data: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Data-parallel ranks inside one server (--data-parallel-size, internal load balancing). Above 1, "
        "vLLM serves a static K: a per-batch-size schedule (cutoff, tuning) is not rendered.",
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Nodes (pods) per server. Above 1 a LeaderWorkerSet group serves it (the LeaderWorkerSet "
        "controller must be installed): the leader runs the API server, the other pods headless ranks.",
    )


def layout_rules(owner: str) -> list[Any]:
    """CEL rules on the block that holds `parallelism` beside `tensorParallelSize` (`owner` names it in messages):
    the two tensor sizes agree, and the nodes split the server evenly."""
    tensor = "(has(self.parallelism.tensor) ? self.parallelism.tensor : self.tensorParallelSize)"
    p = "self.parallelism"
    return [
        {
            # tensorParallelSize: 1 is its default, stored on every object written before `parallelism` existed: it
            # yields to parallelism.tensor
            "rule": f"!has({p}) || !has({p}.tensor) || self.tensorParallelSize == 1 "
            f"|| self.tensorParallelSize == {p}.tensor",
            "message": f"{owner}.parallelism.tensor and {owner}.tensorParallelSize disagree: set one of them",
        },
        {
            "rule": f"!has({p}) || {p}.nodes == 1 || ({p}.data == 1 ? ({tensor} * {p}.pipeline) % {p}.nodes == 0 "
            f": {p}.data % {p}.nodes == 0)",
            "message": f"{owner}.parallelism.nodes must divide the server evenly: tensor × pipeline GPUs over the "
            "nodes when data is 1, else whole data-parallel ranks per node (data a multiple of nodes)",
        },
    ]


def layout(parallelism: Parallelism | None, tensor_parallel_size: int) -> Layout:
    """The resolved layout: parallelism's sizes, its tensor size defaulting to tensorParallelSize."""
    if parallelism is None:
        return Layout(tensor=tensor_parallel_size)
    return Layout(
        tensor=parallelism.tensor or tensor_parallel_size,
        pipeline=parallelism.pipeline,
        data=parallelism.data,
        nodes=parallelism.nodes,
    )


# flags the renderer sets for a layout: extraArgs may not set them
PARALLEL_FLAGS = (
    "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl",
    "--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp", "--data-parallel-start-rank", "-dpr",
    "--data-parallel-backend", "-dpb", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port",
    "--headless", "--distributed-executor-backend",
)  # fmt: skip
