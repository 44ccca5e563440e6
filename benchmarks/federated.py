"""Federated learning through a real control plane: 8 Flower clients on a non-IID (Dirichlet
alpha 0.3) MNIST partition, FedAvg and FedProx, against centralized training of the same model
on the same data with the same compute (issue 29).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/federated.py [--rounds 10] [--local-epochs 1]
    HOME=$(mktemp -d) .venv/bin/python benchmarks/federated.py --quick

MNIST is the 10,000 images of ../shared/data/mnist (t10k): 8,000 are shared out among the
clients (a tenant dataset, pushed; Dirichlet alpha 0.3, seed 0), 2,000 are held out; every
accuracy below is on those 2,000: the federated global model of the last round's checkpoint,
and the centralized model trained in this process on exactly the rows the clients train on
(each client holds back 20 % of its share for the federated evaluation) for ``rounds x
local_epochs`` epochs: the same model (the example's ``build_model``, the same initial
weights), SGD with the same learning rate, momentum and batch, the same normalisation.
``round_overhead_s`` is the median over rounds of the round's wall time (from the end of the
previous round's bookkeeping to the end of this round's: sampling, both halves of the round,
checkpoint, report, stop check) less the slowest client's training and evaluation and the
aggregation (the platform's and Flower's share: serialisation, gRPC, checkpoint, reports);
``bytes_per_client_round`` the mean over rounds of the model bytes one client received and
sent. ``--quick``: 3 rounds (a check that it runs; the accuracies are not the comparison).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir  # noqa: E402

from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray  # noqa: E402
from trainhub.adapters.sandbox import bwrap_problem  # noqa: E402
from trainhub.client import TrainhubClient  # noqa: E402
from trainhub.client.datasets import push_dataset  # noqa: E402
from trainhub.core.partition import partition_indices, split_local  # noqa: E402

MNIST = REPO.parent / "shared" / "data" / "mnist"
if not MNIST.is_dir():
    MNIST = Path("/work/shared/data/mnist")
CLIENT = REPO / "examples" / "federated"
CLIENTS = 8
ALPHA = 0.3
SEED = 0
LR = 0.05
TRAIN = 8000


def idx(path: Path) -> np.ndarray:
    data = gzip.decompress(path.read_bytes())
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _example() -> Any:
    """examples/federated/client.py as a module (it serves a federation only as a script)."""
    found = importlib.util.spec_from_file_location("federated_example", CLIENT / "client.py")
    assert found is not None
    assert found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def model() -> nn.Module:
    """The clients' model, with the clients' initial weights."""
    net: nn.Module = _example().build_model(784, 10)
    return net


def client_train_rows(labels: np.ndarray) -> np.ndarray:
    """The rows of the pushed set the clients train on: each client's share (the partition of
    the spec) less the 20 % it holds out (trainhub.runtime.federated.client_data's split)."""
    rows = []
    for client, share in enumerate(partition_indices(labels, CLIENTS, alpha=ALPHA, seed=SEED)):
        train, _ = split_local(len(share), 0.2, SEED * 100_003 + client)
        rows.append(share[train])
    return np.sort(np.concatenate(rows))


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def centralized(x: torch.Tensor, y: torch.Tensor, epochs: int) -> nn.Module:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=generator).split(32):
            loss = nn.functional.cross_entropy(net(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net


def spec(strategy: str, rounds: int, local_epochs: int, mean: float, std: float) -> str:
    return json.dumps(
        {
            "name": f"bench-{strategy}",
            "kind": "federated",
            "entrypoint": "python client.py",
            "resources": {"cpus_per_worker": 0.1},
            "max_restarts": 0,
            "data": [{"name": "mnist-train", "mount": "/data/mnist"}],
            "hyperparameters": {
                "lr": LR,
                "local_epochs": local_epochs,
                "x_mean": mean,
                "x_std": std,
            },
            "federated": {
                "clients": CLIENTS,
                "rounds": rounds,
                "strategy": strategy,
                "proximal_mu": 0.01,
                "partition": {
                    "dataset": "mnist-train",
                    "scheme": "dirichlet",
                    "alpha": ALPHA,
                    "seed": SEED,
                },
            },
        }
    )


def federate(
    plane: ControlPlaneProcess, text: str, x: torch.Tensor, y: torch.Tensor
) -> dict[str, Any]:
    r = plane.request(
        "POST",
        "/experiments",
        data={"spec": text},
        files={"context": ("c.tar.gz", pack_dir(CLIENT), "application/gzip")},
    )
    r.raise_for_status()
    trial_id = r.json()["trials"][0]["id"]
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=1800, what="done")
    rows: dict[int, dict[str, float]] = {}
    for point in plane.metrics(trial_id):
        rows.setdefault(int(point["step"]), {}).update(point.get("values") or {})
    with TrainhubClient(plane.url, plane.token, timeout_s=120) as client:
        latest = max(client.list_checkpoints(trial_id), key=lambda c: c["step"])
        blob = client.download_checkpoint(trial_id, latest["id"])
    state = torch.load(io.BytesIO(blob), weights_only=True)
    net = model()
    keys = list(net.state_dict())
    net.load_state_dict(dict(zip(keys, state["parameters"], strict=True)))
    return {"rows": rows, "accuracy": accuracy(net, x, y), "round": state["round"]}


def overhead_parts(steps: dict[int, dict[str, float]]) -> dict[str, float]:
    """Medians over rounds of where a round's overhead goes: each half of the round less its
    slowest client (serialisation, gRPC, the clients' waits for a core, the aggregation of
    the fit half), the checkpoint, the previous round's report and stop check."""

    def slowest(row: dict[str, float], name: str) -> float:
        return max((v for k, v in row.items() if k.endswith(f"/{name}")), default=0.0)

    parts = {
        "fit_less_slowest_client": [r["fit_round_s"] - slowest(r, "fit_s") for r in steps.values()],
        "evaluate_less_slowest_client": [
            r["evaluate_round_s"] - slowest(r, "eval_s") for r in steps.values()
        ],
        "aggregate": [r["aggregate_s"] for r in steps.values()],
        "checkpoint": [r["checkpoint_s"] for r in steps.values()],
        "report_and_stop_check": [r["bookkeeping_s"] for r in steps.values()],
    }
    return {name: round(statistics.median(values), 3) for name, values in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="3 rounds: a check that it runs")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    images = idx(MNIST / "t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    labels = idx(MNIST / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:TRAIN], order[TRAIN:]
    mean, std = float(images[train].mean()), float(images[train].std())
    x_test = torch.from_numpy((images[test][:, None] - mean) / std)
    y_test = torch.from_numpy(labels[test])
    scratch = Path(tempfile.mkdtemp(prefix="trainhub-bench-federated-"))
    home = scratch / "home"
    home.mkdir()
    folder = scratch / "mnist-train"
    folder.mkdir()
    np.save(folder / "x.npy", images[train][:, None])
    np.save(folder / "y.npy", labels[train])
    address = ensure_local_ray(home / "ray", num_cpus=CLIENTS + 2)
    sandbox = "bwrap" if bwrap_problem() is None else "none"
    plane = ControlPlaneProcess(home, address, settings={"sandbox": sandbox})
    try:
        plane.start()
        with TrainhubClient(plane.url, plane.token, timeout_s=600) as client:
            push_dataset(client, "mnist-train", folder)
        started = time.monotonic()
        fedavg = federate(
            plane, spec("fedavg", args.rounds, args.local_epochs, mean, std), x_test, y_test
        )
        fedavg_s = time.monotonic() - started
        fedprox = federate(
            plane, spec("fedprox", args.rounds, args.local_epochs, mean, std), x_test, y_test
        )
        rows = train[client_train_rows(labels[train])]
        x_train = torch.from_numpy((images[rows][:, None] - mean) / std)
        net = centralized(x_train, torch.from_numpy(labels[rows]), args.rounds * args.local_epochs)
        central = accuracy(net, x_test, y_test)
        steps = fedavg["rows"]
        line = {
            "benchmark": "federated",
            "clients": CLIENTS,
            "alpha": ALPHA,
            "rounds": args.rounds,
            "local_epochs": args.local_epochs,
            "quick": args.quick,
            "train_rows": len(rows),
            "accuracy": round(fedavg["accuracy"], 4),
            "centralized_accuracy": round(central, 4),
            "fedprox_accuracy": round(fedprox["accuracy"], 4),
            "fedprox_vs_fedavg_points": round(100 * (fedprox["accuracy"] - fedavg["accuracy"]), 2),
            "bytes_per_client_round": round(
                statistics.mean(r["bytes_per_client"] for r in steps.values())
            ),
            "round_overhead_s": round(
                statistics.median(r["round_overhead_s"] for r in steps.values()), 3
            ),
            "round_s": round(statistics.median(r["round_s"] for r in steps.values()), 3),
            "round_overhead_parts_s": overhead_parts(steps),
            "fedavg_trial_s": round(fedavg_s, 1),
            "sandbox": sandbox,
            "targets": {
                "accuracy": "centralized_accuracy - 2 points",
                "round_overhead_s": "<= 0.5",
            },
        }
        print(json.dumps(line), flush=True)
    finally:
        plane.stop()
        stop_local_ray(home / "ray")
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
