"""A small MLP watched with ctx.watch; a NaN planted in its middle layer's weights at step
``nan_at`` (0: none). The trial's alerts must name that layer."""

import math

import torch
import torch.nn.functional as F
from torch import nn

import trainhub
from trainhub.runtime import unwrap_model

ctx = trainhub.init(hparams={"steps": 30, "every": 5, "nan_at": 20})
hp = ctx.hparams
torch.set_num_threads(1)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
model = ctx.prepare_model(net)
watch = ctx.watch(model, every=hp["every"])
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for step in range(hp["steps"]):
    if step == hp["nan_at"]:
        with torch.no_grad():
            unwrap_model(model)[2].weight[3, 5] = float("nan")
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if math.isfinite(loss.item()):
        ctx.report(step=step, loss=loss.item())
watch.flush()
ctx.close()
