"""A tiny transformer split over the trial's ranks by the spec's pipeline/tensor lines.

`python train.py crash`: the first attempt saves a checkpoint after step 2 and rank 1 kills
itself at step 3; the restart resumes there. Model, data and lr are those of
tests/distributed/model_parallel_ranks.py, whose single-process losses the test compares with.
"""

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn

import trainhub
from trainhub import models

STEPS, BATCH, LR = 5, 8, 0.05
MODEL = {"input_dim": 6, "max_length": 4, "dim": 16, "depth": 4, "num_heads": 2}


def batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, MODEL["max_length"], MODEL["input_dim"], generator=gen)
    return x, torch.randint(0, 3, (BATCH,), generator=gen)


ctx = trainhub.init()
torch.manual_seed(0)
model = models.create("transformer", num_classes=3, **MODEL)
par = ctx.parallelize(model, loss_fn=nn.functional.cross_entropy)  # SpecRefused: exit 78
optimizer = ctx.prepare_optimizer(torch.optim.SGD(par.parameters(), lr=LR, momentum=0.9))
timer = ctx.step_timer()
state = ctx.restore()
start = 0 if state is None else int(state["step"]) + 1
print(f"layout {par.layout.describe()}, stage {par.stage}, starting at step {start}", flush=True)
if state is not None:
    print(f"resumed from the checkpoint of step {start - 1}", flush=True)
for step in range(start, STEPS):
    if step == 3 and ctx.attempt == 1 and sys.argv[1:] == ["crash"] and ctx.rank == 1:
        print("rank 1 kills itself at step 3", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = batch(step)
    with timer.phase("forward"):  # forward and backward of every micro-batch
        loss = par.step(x, y)
    with timer.phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad()
    timer.end_step(len(x))
    ctx.report(step=step, loss=float(loss), **timer.summary())
    if step == 2:
        handle = ctx.save_checkpoint({**par.state_dict(optimizer), "step": step}, step=step)
        if handle is not None:
            handle.wait()  # registered before rank 1 goes
        dist.barrier()
ctx.close()
