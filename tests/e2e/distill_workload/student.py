"""Distil the teacher into a student on every rank's shard (the spec's distill section)."""

import torch
from nets import accuracy, data, student, teacher

import trainhub

torch.manual_seed(0)
ctx = trainhub.init()
x, y = data()
model = ctx.prepare_model(student())
distiller = ctx.distiller(model, teacher())  # weights: distill.teacher, fetched on every rank
teacher_accuracy = accuracy(distiller.teacher, x[768:], y[768:])
optimizer = torch.optim.Adam([*model.parameters(), *distiller.parameters()], lr=0.01)
shard_x, shard_y = x[:768][ctx.rank :: ctx.world_size], y[:768][ctx.rank :: ctx.world_size]
for epoch in range(60):
    loss = distiller.loss(shard_x, model(shard_x), shard_y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if epoch % 20 == 0 or epoch == 59:
        terms = {k: v.item() for k, v in distiller.last_terms.items()}
        ctx.report(
            step=epoch,
            loss=loss.item(),
            val_accuracy=accuracy(model, x[768:], y[768:]),
            teacher_accuracy=teacher_accuracy,
            **terms,
        )
adapter = sum(p.double().sum().item() for p in distiller.parameters())
print(f"rank {ctx.rank} adapter_sum={adapter:.9f}", flush=True)
ctx.close()
