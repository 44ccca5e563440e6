"""A plain torchrun script (it never imports trainhub): DDP over gloo on scikit-learn's digits.

Rank 0 sends each epoch's validation accuracy to the control plane's REST API with the trial's
token, as any framework could; nothing here asks whether to stop, so a pruned trial is ended by
SIGTERM. Its hyperparameters come from ``TRAINHUB_HPARAMS`` (JSON): ``q`` scales the learning rate,
and a worse (smaller) ``q`` also makes each epoch slower, so that a test's pruner sees the better
trial's value at every rung first whichever process happened to start first.
"""

import argparse
import json
import os
import time
import urllib.request

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=9)
parser.add_argument("--sleep-s", type=float, default=0.3, help="per epoch, at q = 1")
args = parser.parse_args()
q = float(json.loads(os.environ.get("TRAINHUB_HPARAMS", "{}")).get("q", 1.0))

torch.set_num_threads(1)
dist.init_process_group("gloo")  # env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR/PORT
rank = dist.get_rank()
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target, dtype=torch.long)
order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
val, train = order[:360], order[360:]
shard = train[rank :: dist.get_world_size()]
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5 * q)


def report(epoch: int, accuracy: float) -> None:
    url = (
        f"{os.environ['TRAINHUB_API_URL']}/api/v1/trials/{os.environ['TRAINHUB_TRIAL_ID']}/metrics"
    )
    point = {"step": epoch, "values": {"val_accuracy": accuracy}, "time": time.time()}
    body = {"attempt": int(os.environ["TRAINHUB_ATTEMPT"]), "points": [point]}
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['TRAINHUB_TOKEN']}",
            "Content-Type": "application/json",
        },
    )
    urllib.request.urlopen(request, timeout=10).close()


for epoch in range(1, args.epochs + 1):
    for batch in shard[torch.randperm(len(shard))].split(32):
        loss = F.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
    time.sleep(args.sleep_s + 2.0 * (1.0 - q))
    with torch.no_grad():
        accuracy = (model(x[val]).argmax(1) == y[val]).float().mean().item()
    if rank == 0:
        report(epoch, accuracy)
        print(f"epoch {epoch}: val_accuracy={accuracy:.4f}", flush=True)
print(f"rank {rank} finished every epoch", flush=True)
dist.destroy_process_group()
