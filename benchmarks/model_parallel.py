"""Pipeline x tensor parallelism (pp2 x tp2) against DDP and FSDP on the same 4 gloo ranks.

A transformer (the zoo's, MLP ratio 4) trained with AdamW for the same steps on the same data
under four layouts, each in 4 fresh CPU processes (1 thread each) of this machine, plus one
process training it whole (the loss reference):

- ``ddp``: every rank a full replica with its optimizer state (the memory baseline);
- ``fsdp``: FSDP2 over the 4 ranks (the throughput baseline, "FSDP on the same budget");
- ``pp2xtp2``: ``ctx.parallelize``'s layout, 2 pipeline stages (1F1B, ``--microbatches``) x 2
  tensor-parallel ranks (every block's MLP split colwise/rowwise; attention replicated).

Memory per rank is measured, not computed: the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` once the model is built and split, with freed heap returned by
``malloc_trim``) during the training steps, minus the resident set before the model was built.
That includes the pages of torch's libraries a layout's code first runs (file-backed, shared
by the ranks of a machine: ``file_backed_mb``, their growth from the same start to the end of
the steps), some 50 MB whatever the model's size.
The per-rank budget is half of a DDP replica's parameters, gradients and AdamW state
(``--budget-fraction``), so a replica cannot fit it. Throughput is the global batch over the
mean step time of the timed steps (after ``--warmup``). The bubble fraction is, per pipeline
rank, the part of its step time not spent in its own stage's forward and backward (idle or
waiting on the other stage), the largest over the ranks; beside it, the bubble 1F1B itself
leaves with these stages (``bubble_fraction_zero_comm``): the schedule replayed with each
stage's measured mean micro-batch forward and backward and transfers that cost nothing
(``parallel.one_f_one_b_bubble``). Loss: the largest difference from the single process over
all steps.

One JSON line per layout, then the issue's line::

    {"benchmark": "model_parallel", "layout": "pp2xtp2", "peak_mem_per_rank_vs_dp": ...,
     "samples_per_s_vs_fsdp": ..., "bubble_fraction": ..., "loss_max_abs_diff": ...}

    .venv/bin/python benchmarks/model_parallel.py [--dim 384] [--depth 8] [--steps 6]

Four ranks share this machine's cores: with fewer than 4 free cores, a rank's compute is
slowed by the others' and the waits count as bubble, so timings and the bubble fraction vary
with load; memory and loss do not.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.multiprocessing.spawn import start_processes

WORLD = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kb(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def make_model(args: argparse.Namespace) -> nn.Module:
    from trainhub import models

    torch.manual_seed(0)
    return models.create(
        "transformer",
        num_classes=10,
        input_dim=args.input_dim,
        max_length=args.length,
        dim=args.dim,
        depth=args.depth,
        num_heads=args.heads,
        mlp_ratio=4.0,
    )


def batch(args: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(args.batch, args.length, args.input_dim, generator=gen)
    return x, torch.randint(0, 10, (args.batch,), generator=gen)


def train(rank: int, world: int, layout: str, args: argparse.Namespace) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from trainhub.distributed_contract import DistributedSpec
    from trainhub.runtime.distributed.memory import apply_fsdp
    from trainhub.runtime.distributed.parallel import parallelize

    base_kb, base_file_kb = rss_kb(), rss_kb("RssFile")
    model = make_model(args)
    par = None
    shard, shards = (rank, world) if layout in ("ddp", "fsdp") else (0, 1)
    if layout == "ddp" and world > 1:
        model = DistributedDataParallel(model)
    elif layout == "fsdp":
        model = apply_fsdp(model, device=torch.device("cpu"))
    elif layout == "pp2xtp2":
        spec = DistributedSpec.from_mapping(
            {"pipeline": {"stages": 2, "microbatches": args.microbatches}, "tensor": 2}
        )
        par = parallelize(model, spec, device="cpu", loss_fn=nn.functional.cross_entropy)
        model = par.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reset_peak()
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        x, y = batch(args, step)
        x, y = x[shard::shards], y[shard::shards]
        start = time.perf_counter()
        optimizer.zero_grad()
        if par is not None:
            loss = par.step(x, y)
        else:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        value = loss.detach()
        if shards > 1:
            dist.all_reduce(value)
            value /= shards
        times.append(time.perf_counter() - start)
        losses.append(float(value))
        if par is not None and step == args.warmup - 1:
            par.time_summary()  # the bubble of the timed steps only
    chunk_s = par.times.chunk_s if par is not None else (0.0, 0.0)
    stage = par.stage if par is not None else 0
    shares = par.time_summary() if par is not None else {}
    return {
        "chunk_s": chunk_s,
        "stage": stage,
        "peak_kb": rss_kb("VmHWM") - base_kb,
        "file_kb": rss_kb("RssFile") - base_file_kb,
        "losses": losses,
        "step_s": sum(times[args.warmup :]) / args.steps,
        "bubble": shares.get("time/bubble_share"),
        "tp_comm": shares.get("time/tp_comm_share"),
        "params": sum(p.numel() for p in make_model(args).parameters()),
    }


def _entry(rank: int, world: int, port: int, layout: str, args: Any, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    try:
        result = train(rank, world, layout, args)
    finally:
        gc.collect()
        if world > 1:
            dist.destroy_process_group()
    torch.save(result, Path(out) / f"{rank}.pt")


def run(layout: str, world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        start_processes(  # type: ignore[no-untyped-call]
            _entry,
            args=(world, free_port(), layout, args, out),
            nprocs=world,
            join=True,
            start_method="forkserver",
        )
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--input-dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--budget-fraction", type=float, default=0.5)
    args = parser.parse_args()
    mp.set_forkserver_preload(
        ["torch", "torch.distributed", "torch.distributed.pipelining", "trainhub.models"]
    )
    reference = run("ddp", 1, args)[0]["losses"]
    results = {layout: run(layout, WORLD, args) for layout in ("ddp", "fsdp", "pp2xtp2")}
    from trainhub.runtime.distributed.parallel import one_f_one_b_bubble

    n_params = results["ddp"][0]["params"]
    stages: dict[int, list[tuple[float, float]]] = {}
    for r in results["pp2xtp2"]:
        stages.setdefault(r["stage"], []).append(r["chunk_s"])
    chunk_s = [
        (sum(f for f, _ in c) / len(c), sum(b for _, b in c) / len(c))
        for _, c in sorted(stages.items())
    ]
    zero_comm = max(one_f_one_b_bubble(chunk_s, args.microbatches))
    replica_mb = n_params * 4 * 4 / 2**20  # params, grads, AdamW's two moments (fp32)
    budget_mb = args.budget_fraction * replica_mb
    peaks = {k: max(r["peak_kb"] for r in v) / 1024 for k, v in results.items()}
    files = {k: max(r["file_kb"] for r in v) / 1024 for k, v in results.items()}
    speed = {k: args.batch / max(r["step_s"] for r in v) for k, v in results.items()}
    diffs = {
        k: max(abs(a - b) for a, b in zip(v[0]["losses"], reference, strict=True))
        for k, v in results.items()
    }
    for layout, ranks in results.items():
        line: dict[str, Any] = {
            "benchmark": "model_parallel_layout",
            "layout": layout,
            "params_m": round(n_params / 1e6, 2),
            "peak_mem_per_rank_mb": round(peaks[layout], 1),
            "file_backed_mb": round(files[layout], 1),
            "budget_mb": round(budget_mb, 1),
            "fits_budget": peaks[layout] <= budget_mb,
            "samples_per_s": round(speed[layout], 2),
            "loss_max_abs_diff": diffs[layout],
        }
        if layout == "pp2xtp2":
            line["bubble_fraction"] = round(max(r["bubble"] for r in ranks), 4)
            line["tp_comm_share"] = round(max(r["tp_comm"] for r in ranks), 4)
            line["bubble_fraction_zero_comm"] = round(zero_comm, 4)
            line["stage_chunk_ms"] = [[round(1e3 * t, 2) for t in fb] for fb in chunk_s]
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "benchmark": "model_parallel",
                "layout": "pp2xtp2",
                "peak_mem_per_rank_vs_dp": round(peaks["pp2xtp2"] / peaks["ddp"], 3),
                "samples_per_s_vs_fsdp": round(speed["pp2xtp2"] / speed["fsdp"], 3),
                "bubble_fraction": round(max(r["bubble"] for r in results["pp2xtp2"]), 4),
                "bubble_bound_1f1b": round(1 / (args.microbatches + 1), 4),
                "bubble_fraction_zero_comm": round(zero_comm, 4),
                "loss_max_abs_diff": diffs["pp2xtp2"],
                "fsdp_peak_mem_per_rank_vs_dp": round(peaks["fsdp"] / peaks["ddp"], 3),
                "fsdp_loss_max_abs_diff": diffs["fsdp"],
                "steps": args.steps,
                "microbatches": args.microbatches,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
