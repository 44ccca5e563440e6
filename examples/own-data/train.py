"""A small MLP on the team's own dataset, read from where the spec mounts it.

The data are not in the code: `trainhub data push spirals examples/own-data/data` stores them
as a dataset version of the tenant, and the spec's `data` list mounts it read-only at
/data/spirals in every rank's sandbox (docs/data.md).

Launch:

    python examples/own-data/make_data.py                                  # the CSV
    trainhub data push spirals examples/own-data/data                      # version 1
    trainhub submit examples/own-data/experiment.yaml -C examples/own-data --follow

Standalone (no trainhub server), point DATA at the folder:

    DATA=examples/own-data/data python examples/own-data/train.py
"""

import os

import torch
import torch.nn.functional as F
from torch import nn

import trainhub
from trainhub.data.mounted import load_mounted

# -----------------------------------------------------------------------------
lr = 0.01
batch_size = 64
epochs = 30
hidden = 64
data = os.environ.get("DATA", "/data/spirals")  # the spec's mount path
# -----------------------------------------------------------------------------


def main() -> None:
    torch.set_num_threads(1)
    ctx = trainhub.init(hparams={"lr": lr, "batch_size": batch_size, "epochs": epochs})
    hp = ctx.hparams
    torch.manual_seed(0)
    splits = load_mounted(data, layout="csv", label_column="label")
    if ctx.is_chief:
        print(f"data: {splits.description}", flush=True)
    features = splits.input_shape[0]
    model = ctx.prepare_model(
        nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, splits.num_classes),
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"])
    loader = ctx.prepare_data_loader(splits.train, batch_size=hp["batch_size"], shuffle=True)
    x_val, y_val = splits.val.tensors[:2]
    for epoch in range(hp["epochs"]):
        ctx.set_epoch(loader, epoch)
        model.train()
        for batch in loader:
            x, y = batch[0], batch[1]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = float((model(x_val).argmax(1) == y_val).float().mean())
        ctx.report(step=epoch, train_loss=float(loss), val_accuracy=accuracy)
        if ctx.should_stop():
            break
    if ctx.is_chief:
        print(f"final val_accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
