"""A 2-rank trial across the two Ray nodes of :mod:`tests.distributed.netns`.

Run as a Ray driver inside namespace A (``TwoHostCluster.run_driver``): it places two rank actors
with a STRICT_SPREAD placement group (one per node), sets up gloo between them (rank 0's node
address is the rendezvous), and runs each job of ``--jobs`` (a JSON list) in turn with the same
process group, printing one JSON line per job. A job::

    {"name": "mlp/topk", "model": "mlp", "model_kwargs": {...}, "dataset": "mnist",
     "train_size": 8000, "val_size": 2000, "epochs": 2, "batch_size": 64, "lr": 0.05,
     "distributed": {"strategy": "topk", "topk": {"density": 0.01}}}
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import socket
import sys
import time
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from torch import nn


def run_job(rank: int, job: dict[str, Any]) -> dict[str, Any]:
    """Train one job on this rank (every rank calls it); rank 0's result is reported."""
    from trainhub import data, models
    from trainhub.data.loader import make_loader, set_epoch
    from trainhub.runtime.distributed import DistributedConfig, StepTimer, apply_strategy

    torch.manual_seed(job.get("seed", 0))
    if job["dataset"] == "mnist":
        splits = data.load(
            "mnist", train_size=job.get("train_size", 8000), val_size=job.get("val_size", 2000)
        )
    else:
        splits = data.load(job["dataset"])
    config = DistributedConfig.from_mapping(job.get("distributed", {}))
    model = models.create(job["model"], **job.get("model_kwargs", {}))
    prepared = apply_strategy(model, config, device="cpu")
    optimizer = prepared.make_optimizer(lr=job.get("lr", 0.05), momentum=0.9)
    loader = make_loader(splits.train, job.get("batch_size", 64), seed=1)
    timer = StepTimer(meter=prepared.meter)
    epochs = job.get("epochs", 1)
    per_epoch: list[dict[str, float]] = []
    base_lr, total_steps, step = job.get("lr", 0.05), epochs * len(loader), 0
    dist.barrier()
    started = time.perf_counter()
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        for x, y in timer.iter_data(loader):
            if job.get("lr_schedule", "constant") == "cosine":
                # anneal to 0 at the end: the final weights (what is evaluated) are then not one
                # noisy iterate of a high constant rate, whose accuracy swings by points
                for group in optimizer.param_groups:
                    group["lr"] = base_lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            step += 1
            with timer.phase("forward"):
                loss = nn.functional.cross_entropy(prepared.model(x), y)
            with timer.phase("backward"):
                loss.backward()
            with timer.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            timer.end_step(len(x))
        per_epoch.append(timer.summary())
    train_s = time.perf_counter() - started
    prepared.average_replicas()  # local SGD: evaluate the average of the replicas
    module = prepared.module
    x_val, y_val = splits.val.tensors  # type: ignore[attr-defined]
    module.eval()
    with torch.no_grad():
        correct = sum(
            int((module(xb).argmax(1) == yb).sum())
            for xb, yb in zip(x_val.split(500), y_val.split(500), strict=True)
        )
    if prepared.ps_client is not None:
        dist.barrier()
        prepared.ps_client.close()
    return {
        "name": job.get("name", job["model"]),
        "accuracy": correct / len(y_val),
        "train_s": train_s,
        "epochs": per_epoch,
        "num_parameters": sum(p.numel() for p in module.parameters()),
        "node_ip": ray.util.get_node_ip_address(),
    }


@ray.remote(num_cpus=1)
class RankWorker:
    """One rank: a process on one node of the cluster."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        torch.set_num_threads(1)

    def address(self) -> tuple[str, int]:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def init_process_group(self, master: str, port: int) -> str:
        os.environ["RAY_ADDRESS"] = os.environ.get("RAY_ADDRESS", "auto")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master}:{port}",
            rank=self.rank,
            world_size=self.world_size,
        )
        return ray.util.get_node_ip_address()

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        return run_job(self.rank, job)

    def shutdown(self) -> None:
        if dist.is_initialized():
            gc.collect()  # DDP models first (see tests/distributed/launch.py)
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", required=True, help="JSON list of jobs")
    args = parser.parse_args(argv)
    jobs = json.loads(args.jobs)
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=120)
    workers = [
        RankWorker.options(  # type: ignore[attr-defined]
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=rank
            ),
            runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": os.environ["GLOO_SOCKET_IFNAME"]}},
        ).remote(rank, 2)
        for rank in range(2)
    ]
    master, port = ray.get(workers[0].address.remote())
    nodes = ray.get([w.init_process_group.remote(master, port) for w in workers])
    print(json.dumps({"event": "placed", "nodes": nodes}), flush=True)
    for job in jobs:
        results = ray.get([w.run.remote(job) for w in workers])
        print(json.dumps({"event": "result", **results[0], "rank_nodes": nodes}), flush=True)
    ray.get([w.shutdown.remote() for w in workers])
    remove_placement_group(group)
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
