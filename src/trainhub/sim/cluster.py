"""Simulated clusters: a list of node shapes, built uniform or from a trace's node list."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainhub.core.resources import Node
from trainhub.core.scheduling.view import NodeFacts


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    num_gpus: int
    num_cpus: float = 1e6
    gpu_model: str | None = None
    gpu_temperature_c: float | None = None
    memory_gb: float = math.inf
    labels: Mapping[str, str] = field(default_factory=dict)  # rack, block (core/topology.py)

    def facts(self) -> NodeFacts:
        return NodeFacts(
            node_id=self.node_id,
            labels=dict(self.labels),
            total_gpus=self.num_gpus,
            total_cpus=self.num_cpus,
            total_memory_gb=self.memory_gb,
            gpu_model=self.gpu_model,
            gpu_temperature_c=self.gpu_temperature_c,
        )

    def node(self) -> Node:
        return Node(
            node_id=self.node_id,
            labels=dict(self.labels),
            total_gpus=self.num_gpus,
            total_cpus=self.num_cpus,
            free_gpus=self.num_gpus,
            free_cpus=self.num_cpus,
            gpu_model=self.gpu_model,
            gpu_temperature_c=self.gpu_temperature_c,
            total_memory_gb=self.memory_gb,
            free_memory_gb=self.memory_gb,
        )


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids must be unique")

    @classmethod
    def uniform(
        cls,
        num_nodes: int,
        gpus_per_node: int,
        cpus_per_node: float = 1e6,
        gpu_model: str | None = None,
        memory_gb_per_node: float = math.inf,
    ) -> ClusterSpec:
        if num_nodes < 1 or gpus_per_node < 0:
            raise ValueError("num_nodes must be >= 1 and gpus_per_node >= 0")
        width = len(str(num_nodes - 1))
        return cls(
            tuple(
                NodeSpec(
                    f"node-{i:0{width}d}",
                    gpus_per_node,
                    cpus_per_node,
                    gpu_model,
                    memory_gb=memory_gb_per_node,
                )
                for i in range(num_nodes)
            )
        )

    @classmethod
    def racks(
        cls,
        blocks: int,
        racks_per_block: int,
        nodes_per_rack: int,
        gpus_per_node: int,
        cpus_per_node: float = 1e6,
    ) -> ClusterSpec:
        """``blocks`` x ``racks_per_block`` x ``nodes_per_rack`` nodes, each labelled with its
        rack (``b0-r1``) and block (``b0``)."""
        nodes = []
        for b in range(blocks):
            for r in range(racks_per_block):
                for n in range(nodes_per_rack):
                    labels = {"block": f"b{b}", "rack": f"b{b}-r{r}"}
                    nodes.append(
                        NodeSpec(f"b{b}-r{r}-n{n:02d}", gpus_per_node, cpus_per_node,
                                 labels=labels)
                    )  # fmt: skip
        return cls(tuple(nodes))

    def domain_gpus(self, level: str) -> int:
        """The GPUs of the largest domain of ``level`` (``node``: the largest node)."""
        if level == "node":
            return max(n.num_gpus for n in self.nodes)
        totals: dict[str, int] = {}
        for n in self.nodes:
            name = n.labels.get(level)
            if name is not None:
                totals[name] = totals.get(name, 0) + n.num_gpus
        return max(totals.values(), default=0)

    @property
    def total_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    def describe(self) -> str:
        shapes: dict[tuple[int, str | None], int] = {}
        for n in self.nodes:
            shapes[(n.num_gpus, n.gpu_model)] = shapes.get((n.num_gpus, n.gpu_model), 0) + 1
        parts = [
            f"{count} x {gpus} GPU{' ' + model if model else ''}"
            for (gpus, model), count in sorted(shapes.items(), key=lambda s: -s[1])
        ]
        return ", ".join(parts) + f" ({self.total_gpus} GPUs)"


def load_tiresias_cluster(path: Path) -> ClusterSpec:
    """``n32g4.csv``: num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node."""
    with Path(path).open(newline="") as handle:
        row = next(csv.DictReader(handle))
    nodes = int(row["num_switch"]) * int(row["num_node_p_switch"])
    return ClusterSpec.uniform(nodes, int(row["num_gpu_p_node"]), float(row["num_cpu_p_node"]))


def load_openb_nodes(path: Path) -> ClusterSpec:
    """Alibaba openb node list (``sn,cpu_milli,memory_mib,gpu,model``); GPU nodes only."""
    nodes = []
    with Path(path).open(newline="") as handle:
        for row in csv.DictReader(handle):
            gpus = int(row["gpu"])
            if gpus <= 0:
                continue
            nodes.append(
                NodeSpec(
                    row["sn"],
                    gpus,
                    float(row["cpu_milli"]) / 1000.0,
                    row["model"] or None,
                    memory_gb=float(row.get("memory_mib") or 0) / 1024.0 or math.inf,
                )
            )
    return ClusterSpec(tuple(nodes))
