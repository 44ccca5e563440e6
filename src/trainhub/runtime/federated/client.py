"""A client's side of a federation: the user's Flower client, metered, connected to the
federation's server with Flower's gRPC client (``flwr.client.start_client``)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import flwr
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
)


def payload_bytes(parameters: Parameters) -> int:
    """The bytes of a model as Flower sends it: its serialised tensors."""
    return sum(len(t) for t in parameters.tensors)


class MeteredClient(flwr.client.Client):
    """The user's client, with the bytes it receives and sends per round and the seconds it
    spends training and evaluating added to the metrics it returns."""

    def __init__(self, inner: flwr.client.Client, number: int, joined: str | None) -> None:
        self._inner = inner
        self._number = number
        self._joined = Path(joined) if joined else None

    def _served(self) -> None:
        if self._joined is not None and not self._joined.exists():
            self._joined.touch()

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        return self._inner.get_properties(ins)

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        res = self._inner.get_parameters(ins)
        self._served()
        return res

    def fit(self, ins: FitIns) -> FitRes:
        received = payload_bytes(ins.parameters)
        started = time.perf_counter()
        res = self._inner.fit(ins)
        seconds = time.perf_counter() - started
        metrics: dict[str, Any] = dict(res.metrics or {})
        metrics.update(
            {
                "client": self._number,
                "bytes_received": received,
                "bytes_sent": payload_bytes(res.parameters),
                "fit_s": seconds,
            }
        )
        self._served()
        return FitRes(res.status, res.parameters, res.num_examples, metrics)

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        received = payload_bytes(ins.parameters)
        started = time.perf_counter()
        res = self._inner.evaluate(ins)
        seconds = time.perf_counter() - started
        metrics: dict[str, Any] = dict(res.metrics or {})
        metrics.update({"client": self._number, "bytes_received": received, "eval_s": seconds})
        self._served()
        return EvaluateRes(res.status, res.loss, res.num_examples, metrics)


def serve(
    user_client: flwr.client.NumPyClient | flwr.client.Client,
    number: int,
    server: str,
    joined: str | None,
    max_wait_s: float,
) -> None:
    """Serve the federation at ``server`` until its server ends it."""
    inner = user_client if isinstance(user_client, flwr.client.Client) else user_client.to_client()
    client = MeteredClient(inner, number, joined)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        flwr.client.start_client(
            server_address=server, client=client, insecure=True, max_wait_time=max_wait_s
        )


__all__ = ["Code", "MeteredClient", "payload_bytes", "serve"]
