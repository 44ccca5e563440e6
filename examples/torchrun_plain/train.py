"""A plain torchrun script (no trainhub import): an MLP on scikit-learn's digits with DDP.

It runs unchanged under torchrun and as a trainhub trial, because the trainhub executor sets the
same variables torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

Launch:

    python examples/torchrun_plain/train.py                                   # one process
    torchrun --standalone --nproc-per-node 2 examples/torchrun_plain/train.py # two ranks
    trainhub submit examples/torchrun_plain/experiment.yaml -C examples/torchrun_plain

Rank 0 prints one JSON line of metrics per epoch; trainhub keeps it in the trial's log.
"""

import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.003)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
args = parser.parse_args()

torch.set_num_threads(1)  # one core per rank
# torchrun (or the trainhub executor) sets these; without them this is a single process
distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
use_gpu = distributed and torch.cuda.is_available()
if distributed:
    if use_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_gpu else "gloo")  # env:// rendezvous
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
else:
    rank, world_size, device = 0, 1, torch.device("cpu")
if rank == 0:
    print(f"world_size={world_size} device={device}", flush=True)

# the same split on every rank: a fixed permutation
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target, dtype=torch.long)
order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
val_idx, train_idx = order[:360], order[360:]
train_set = TensorDataset(x[train_idx], y[train_idx])
sampler = DistributedSampler(train_set) if distributed else None
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
if distributed:
    model = DistributedDataParallel(model, device_ids=[device.index] if use_gpu else None)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    if sampler is not None:
        sampler.set_epoch(epoch)  # reshuffle differently each epoch
    model.train()
    total_loss, seen = 0.0, 0
    for inputs, labels in loader:
        loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        total_loss, seen = total_loss + loss.item() * len(labels), seen + len(labels)
    model.eval()
    with torch.no_grad():
        predictions = model(x[val_idx].to(device)).argmax(dim=1)
        val_accuracy = (predictions == y[val_idx].to(device)).float().mean().item()
    if rank == 0:
        metrics = {"step": epoch, "train_loss": total_loss / seen, "val_accuracy": val_accuracy}
        print(json.dumps(metrics), flush=True)

if distributed:
    # free the DDP model before the process group: left to the garbage collection during
    # interpreter shutdown, it can make PyTorch's gloo abort the process after a successful run
    # (exit code -6; pytorch/pytorch#179291)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
