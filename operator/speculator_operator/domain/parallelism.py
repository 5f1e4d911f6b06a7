"""A server's parallel layout with every default resolved, and what vLLM can launch of it: plain facts the CRD
models (api/parallelism.py), the renderers and the release table share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """A server's parallel sizes with every default resolved."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def gpus_per_pod(self) -> int:
        return self.world // self.nodes

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def problem(self) -> str | None:
        """Why vLLM cannot launch this layout (the CRD's rules, for objects written before them), or None."""
        if self.world % self.nodes:
            return f"{self.nodes} nodes do not divide the world size {self.world} (tensor × pipeline × data)"
        if self.data > 1 and self.nodes > 1 and self.data % self.nodes:
            return f"data-parallel size {self.data} is not a multiple of {self.nodes} nodes"
        if self.data == 1 and (self.tensor * self.pipeline) % self.nodes:
            return f"{self.nodes} nodes do not divide tensor × pipeline = {self.tensor * self.pipeline}"
        return None

    def describe(self) -> str:
        parts = [f"{name} {value}" for name, value in self.__dict__.items() if value > 1]
        return ", ".join(parts) or "one GPU"
