"""A Flower client of a federated trial: a small MLP on this client's share of a data set.

Run by trainhub on every client rank (the spec's entrypoint); the server is trainhub's. Each
client reads only its own partition (``data.x``, ``data.y``), trains ``local_epochs`` epochs of
SGD per round (with FedProx's proximal term when the strategy sends a mu) and evaluates on
its held-out share.

Importable: another client may subclass ``Client`` (tests/e2e/federated_workload/client.py
does); run as a script, it serves the federation.
"""

from __future__ import annotations

from typing import Any

import flwr
import numpy as np
import torch
from torch import nn

from trainhub.runtime import federated

torch.set_num_threads(1)  # a client is one process of many on a node


def build_model(inputs: int, classes: int) -> nn.Module:
    torch.manual_seed(0)  # every client starts from the same model (the server takes one)
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, 64), nn.ReLU(), nn.Linear(64, classes))


class Client(flwr.client.NumPyClient):
    def __init__(self, data: federated.ClientData) -> None:
        self.data = data
        self.x_train, self.y_train = data.tensors("train")
        self.x_val, self.y_val = data.tensors("val")
        inputs = int(np.prod(data.x.shape[1:]))
        self.model = build_model(inputs, int(data.hparams.get("classes", 10)))

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        return [p.detach().numpy().copy() for p in self.model.state_dict().values()]

    def _load(self, parameters: list[np.ndarray]) -> None:
        keys = list(self.model.state_dict())
        self.model.load_state_dict(
            {k: torch.from_numpy(v) for k, v in zip(keys, parameters, strict=False)}
        )

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple:
        self._load(parameters)
        start = [p.detach().clone() for p in self.model.parameters()]
        mu = float(config.get("proximal_mu", 0.0))  # > 0 under fedprox only
        lr = float(config.get("lr", 0.05))
        optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        generator = torch.Generator().manual_seed(
            int(config.get("round", 0)) * 1000 + self.data.client
        )
        loss_sum, seen = 0.0, 0
        for _ in range(int(config.get("local_epochs", 1))):
            order = torch.randperm(len(self.y_train), generator=generator)
            for batch in order.split(32)[: int(config.get("max_batches", 10**9))]:
                x, y = self.x_train[batch], self.y_train[batch]
                loss = nn.functional.cross_entropy(self.model(x), y)
                total = loss + federated.proximal_term(self.model, start, mu)
                optimizer.zero_grad()
                total.backward()
                optimizer.step()
                loss_sum += loss.item() * len(y)
                seen += len(y)
        return self.get_parameters({}), len(self.y_train), {"train_loss": loss_sum / max(seen, 1)}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple:
        self._load(parameters)
        if len(self.y_val) == 0:
            return 0.0, 0, {"accuracy": 0.0}
        with torch.no_grad():
            logits = self.model(self.x_val)
            loss = float(nn.functional.cross_entropy(logits, self.y_val))
            accuracy = float((logits.argmax(1) == self.y_val).float().mean())
        return loss, len(self.y_val), {"accuracy": accuracy}


if __name__ == "__main__":
    federated.start_client(Client)
