"""Federated learning on Flower: what a client script calls (docs/federated.md, ADR 0044).

A federated trial's ranks all run ``python -m trainhub.runtime.federated ENTRYPOINT``: rank 0
is the Flower server trainhub runs itself (strategy, rounds, checkpoints and metrics from the
spec's ``federated`` section), every other rank supervises the user's client command (the
entrypoint), which builds a Flower ``NumPyClient`` from its own partition and hands it to
:func:`start_client`::

    from trainhub.runtime import federated

    def client_fn(data: federated.ClientData) -> flwr.client.NumPyClient:
        return MyClient(data.train, data.val, data.hparams)

    federated.start_client(client_fn)

The client sees only its own partition (``data.x``, ``data.y``: the node wrote that share alone
and mounted it read-only) and talks only to the federation's server: it has no token of the
control plane. Its metrics (the ``metrics`` dicts its ``fit`` and ``evaluate`` return) reach
the trial's metrics through the server, as ``client<K>/<name>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import flwr
    import torch

# the same names as trainhub.core.federated_spec (the runtime does not import the core;
# tests/runtime/test_federated.py keeps them equal)
FEDERATED_ENV = "TRAINHUB_FEDERATED"
PARTITION_ENV = "TRAINHUB_FEDERATED_PARTITION"
CLIENT_ENV = "TRAINHUB_FEDERATED_CLIENT"  # this client's number, 0..clients-1
SERVER_ENV = "TRAINHUB_FEDERATED_SERVER"  # host:port of the federation's server
JOINED_ENV = "TRAINHUB_FEDERATED_JOINED"  # a file the client touches once it served a round


@dataclass
class ClientData:
    """What a client knows: its number, its share of the data and the trial's hparams.

    ``x``/``y`` are the client's whole share; ``train``/``val`` a split of it (positions into
    ``x``), 20 % held out for the federated evaluation, seeded by the partition's seed and the
    client number.
    """

    client: int
    clients: int
    x: npt.NDArray[Any]
    y: npt.NDArray[Any]
    train: npt.NDArray[np.int64]
    val: npt.NDArray[np.int64]
    hparams: dict[str, Any] = field(default_factory=dict)
    federated: dict[str, Any] = field(default_factory=dict)

    def tensors(self, which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) of ``train`` or ``val`` as torch tensors: x float32 standardised by the
        hparams ``x_mean`` and ``x_std`` when given (the same for every client), else by the
        mean and std of this client's training rows; y int64."""
        import torch

        rows = self.train if which == "train" else self.val
        x = self.x.astype(np.float32)
        mean = self.hparams.get("x_mean")
        std = self.hparams.get("x_std")
        if mean is None or std is None:
            mean = float(x[self.train].mean())
            std = float(x[self.train].std())
        x = (x[rows] - float(mean)) / (float(std) or 1.0)
        return torch.from_numpy(x), torch.from_numpy(self.y[rows].astype(np.int64))


def client_data(environ: dict[str, str] | None = None) -> ClientData:
    """This client's :class:`ClientData`, from the launch environment."""
    env = dict(os.environ if environ is None else environ)
    federated = json.loads(env.get(FEDERATED_ENV) or "{}")
    folder = Path(env[PARTITION_ENV])
    x, y = np.load(folder / "x.npy"), np.load(folder / "y.npy")
    client = int(env.get(CLIENT_ENV, "0"))
    seed = int(federated.get("partition", {}).get("seed", 0))
    train, val = _split(len(y), 0.2, seed * 100_003 + client)
    hparams = json.loads(env.get("TRAINHUB_HPARAMS") or "{}")
    return ClientData(
        client, int(federated.get("clients", 1)), x, y, train, val, hparams, federated
    )


def _split(size: int, val_fraction: float, seed: int) -> tuple[npt.NDArray[np.int64], ...]:
    """Positions of the train and validation rows; at least one training row."""
    order = np.random.default_rng(seed).permutation(size)
    val = min(round(size * val_fraction), size - 1)
    return np.sort(order[val:]).astype(np.int64), np.sort(order[:val]).astype(np.int64)


def start_client(
    client_fn: Callable[[ClientData], flwr.client.NumPyClient | flwr.client.Client],
    *,
    max_wait_s: float = 120.0,
) -> None:
    """Build this rank's client from its data and serve the federation until it ends.

    The client's traffic is metered: the bytes of the model it receives and of the update it
    sends in each round (serialised tensors, as Flower sends them) reach the trial's metrics
    as ``client<K>/bytes_received`` and ``client<K>/bytes_sent``.
    """
    from trainhub.runtime.federated.client import serve

    data = client_data()
    serve(
        client_fn(data), data.client, os.environ[SERVER_ENV], os.environ.get(JOINED_ENV), max_wait_s
    )


def proximal_term(model: torch.nn.Module, global_params: list[torch.Tensor], mu: float) -> Any:
    """FedProx's term ``mu / 2 * ||w - w_global||^2`` to add to a client's loss (0 with mu 0).

    Example:
        >>> mu = config["proximal_mu"]  # doctest: +SKIP
        >>> loss = loss + federated.proximal_term(model, start, mu)  # doctest: +SKIP
    """
    if mu <= 0:
        return 0.0
    total: Any = 0.0
    for weight, start in zip(model.parameters(), global_params, strict=True):
        total = total + (weight - start).pow(2).sum()
    return mu / 2.0 * total
