"""A plain torchrun DDP script (no trainhub import) used by benchmarks/overhead.py.

    torchrun --standalone --nproc-per-node 2 ddp_mlp.py --steps 300

Trains an MLP on synthetic data and prints one line `RESULT {json}` on rank 0 with the
steady-state samples/s (steps after warm-up) and the wall-clock time of its first step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--hidden", type=int, default=512)
args = parser.parse_args()

torch.set_num_threads(1)  # one core per rank: the ranks share the machine
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(
    nn.Sequential(
        nn.Linear(784, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.batch_size, 784)
y = torch.randint(0, 10, (args.batch_size,))
first_step_unix = 0.0
for step in range(args.steps):
    if step == args.warmup:
        start = time.perf_counter()
        cpu_start = time.process_time()
        usage_start = resource.getrusage(resource.RUSAGE_SELF)
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if step == 0:
        first_step_unix = time.time()
elapsed = time.perf_counter() - start
cpu_s = time.process_time() - cpu_start
usage = resource.getrusage(resource.RUSAGE_SELF)
measured = args.steps - args.warmup
samples = (args.steps - args.warmup) * args.batch_size * world
if rank == 0:
    result = {
        "samples_per_s": samples / elapsed,
        "cpu_s_per_step": cpu_s / measured,  # rank 0's process, all threads
        # where it goes: user and kernel time, page faults, context switches (per step)
        "user_ms_per_step": (usage.ru_utime - usage_start.ru_utime) * 1000 / measured,
        "sys_ms_per_step": (usage.ru_stime - usage_start.ru_stime) * 1000 / measured,
        "minflt_per_step": (usage.ru_minflt - usage_start.ru_minflt) / measured,
        "nvcsw_per_step": (usage.ru_nvcsw - usage_start.ru_nvcsw) / measured,
        "nivcsw_per_step": (usage.ru_nivcsw - usage_start.ru_nivcsw) / measured,
        "first_step_unix": first_step_unix,
        "world_size": world,
        "pid": os.getpid(),
    }
    print("RESULT " + json.dumps(result), flush=True)
# free DDP before the process group: collected during interpreter shutdown instead, it can make
# PyTorch's gloo abort the process (pytorch/pytorch#179291)
del model, optimizer
gc.collect()
dist.destroy_process_group()
