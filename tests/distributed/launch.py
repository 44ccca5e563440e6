"""Run a function on N real gloo ranks (spawned processes) and collect what each returns.

Children import the function by its module path, so it must be a module-level function of an
importable module (``tests.distributed.*``). Each rank runs single-threaded, as two ranks share
this machine's cores.

Ranks are forked from a fork server that imported torch once per test process (``forkserver``
with a preload), not spawned: a spawned rank is a fresh interpreter that imports torch and the
test package again, seconds of CPU per rank and per call on a loaded two-core machine (a
one-line test of two ranks took 55 s spawned, 24-30 s forked, at load 19-22). The fork server
is a single-threaded process that never ran a torch operation, so no OpenMP or gloo state is
copied into a rank; each rank still opens its own process group.
"""

from __future__ import annotations

import gc
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.fixtures.ports import free_port


@dataclass(frozen=True)
class _Job:
    fn: Callable[..., Any]
    world_size: int
    port: int
    out: str
    args: tuple[Any, ...]


def _entry(rank: int, job: _Job) -> None:
    fn, world_size, port, out, args = job.fn, job.world_size, job.port, job.out, job.args
    warnings.simplefilter("error")  # as pytest does in the parent (pyproject filterwarnings)
    torch.set_num_threads(1)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        result = fn(rank, world_size, *args)
        dist.barrier()
    finally:
        # DDP models of ``fn`` sit in reference cycles: collect them while the process group
        # and the interpreter are whole, or gloo can abort the process at exit (see
        # trainhub.runtime.context._collect_cycles_at_exit)
        gc.collect()
        dist.destroy_process_group()
    torch.save(result, Path(out) / f"{rank}.pt")


# modules the fork server imports once for every rank; a test module adds its heavy imports
# (e.g. torch.distributed.pipelining: ~20 s per rank on a loaded machine) before its first call
PRELOAD = ["torch", "torch.distributed", __name__]


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2) -> list[Any]:
    """``fn(rank, world_size, *args)`` on every rank; the list of their return values."""
    # read when the fork server starts (the first call of this test process), ignored after
    mp.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _entry,
            args=(_Job(fn, world_size, free_port(), out, args),),
            nprocs=world_size,
            join=True,
            start_method="forkserver",
        )
        return [
            torch.load(Path(out) / f"{rank}.pt", weights_only=False) for rank in range(world_size)
        ]
