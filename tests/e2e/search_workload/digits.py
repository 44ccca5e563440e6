"""An MLP on scikit-learn's digits for search tests: ``lr`` and ``hidden`` matter, one epoch
takes milliseconds (``sleep_s`` stretches it so that the pruner sees trials side by side)."""

import time

import torch
import torch.nn.functional as F
from torch import nn

import trainhub
from trainhub.data.digits import load_digits

torch.set_num_threads(1)
ctx = trainhub.init()
hp = ctx.hparams
torch.manual_seed(0)
data = load_digits()
images, labels = data.train.tensors
val_images, val_labels = data.val.tensors
model = nn.Sequential(
    nn.Flatten(), nn.Linear(64, hp["hidden"]), nn.ReLU(), nn.Linear(hp["hidden"], 10)
)
optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"])
state = ctx.restore()
start = 1
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["epoch"] + 1
for epoch in range(start, hp["epochs"] + 1):
    order = torch.randperm(len(labels))
    for batch in order.split(64):
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(val_images).argmax(1) == val_labels).float().mean().item()
    time.sleep(hp.get("sleep_s", 0.0))
    ctx.report(step=epoch, val_accuracy=accuracy)
    ctx.save_checkpoint(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
        step=epoch,
    )
    if ctx.should_stop():
        print(f"STOPPED after epoch {epoch}: {ctx.stop_reason}", flush=True)
        break
ctx.close()
