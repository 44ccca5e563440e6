"""One rank of a 2-rank trial that trains until the control plane says stop."""

import json
import time

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import trainhub

torch.set_num_threads(1)
ctx = trainhub.init()
model = ctx.prepare_model(torch.nn.Linear(2, 1))
assert isinstance(model, DistributedDataParallel)
loader = ctx.prepare_data_loader(TensorDataset(torch.arange(10.0)), batch_size=2)
ctx.set_epoch(loader, 1)
shard = sorted(int(x) for (batch,) in loader for x in batch.tolist())

step = 0
while not ctx.should_stop() and step < 5000:
    ctx.report(step=step, alive=1.0)
    step += 1
    time.sleep(0.005 * (ctx.rank + 1))  # the ranks run at different speeds

print(json.dumps({"rank": ctx.rank, "step": step, "reason": ctx.stop_reason, "shard": shard}))
ctx.close()
