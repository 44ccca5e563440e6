"""A small digits classifier whose first ``flips`` training samples carry a wrong label; it
tracks every sample's training dynamics for ``trainhub debug``."""

import torch
from torch import nn

import trainhub
from trainhub import data

ctx = trainhub.init(hparams={"epochs": 12, "flips": 30, "lr": 0.1})
splits = data.load("digits")
_, labels = splits.train.tensors
flips = ctx.hparams["flips"]
labels[:flips] = (labels[:flips] + 1) % 10  # the test knows these: the first sample ids
torch.manual_seed(0)
model = ctx.prepare_model(
    nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
)
optimizer = torch.optim.SGD(model.parameters(), lr=ctx.hparams["lr"], momentum=0.9)
loader = ctx.prepare_data_loader(splits.train.with_ids(), batch_size=64)
for epoch in range(ctx.hparams["epochs"]):
    ctx.set_epoch(loader, epoch)
    for x, y, ids in loader:
        logits = model(x.to(ctx.device))
        loss = nn.functional.cross_entropy(logits, y.to(ctx.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ctx.track_samples(ids, logits, y, epoch=epoch, source=splits.source)
    ctx.report(step=epoch, loss=float(loss))
ctx.close()
