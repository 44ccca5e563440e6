"""A small MLP on scikit-learn's digits, checkpointed for the registry (tests/e2e)."""

import torch

import trainhub
from trainhub import data, models

ctx = trainhub.init()
torch.manual_seed(0)
splits = data.load("digits")
x, y = splits.train.tensors
xv, yv = splits.val.tensors
model, report = ctx.init_model(models.create("mlp", in_features=64, hidden=(32,), num_classes=10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(8):
    for i in range(0, len(x), 64):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64]).backward()
        optimizer.step()
with torch.no_grad():
    accuracy = float((model(xv).argmax(1) == yv).float().mean())
ctx.report(step=0, val_accuracy=accuracy)
ctx.save_checkpoint({"model": model.state_dict()}, step=0, metrics={"val_accuracy": accuracy})
ctx.close()
