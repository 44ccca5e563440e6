"""The federation's server (rank 0): Flower's server with the spec's strategy, whose rounds are
the trial's steps.

Each round it reports the aggregate metrics and each client's metrics through the trainhub
runtime (``ctx.report(step=round)``), saves the global model as the trial's checkpoint and asks
``should_stop()``; a restarted attempt resumes after the round of the checkpoint it is handed.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import flwr
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAdam, FedAvg, FedProx, Strategy

from trainhub.runtime.context import Context

Results = list[tuple[ClientProxy, Any]]
Failures = list[Any]
# after a round in which clients failed, how long the next round waits for them to rejoin
# (their supervisor restarts them: a Python start with torch and flwr, seconds on a loaded
# node) before it goes on with the clients it has; never below min_available_clients.
# The spec's federated.rejoin_wait_s; this is its default
REJOIN_WAIT_S = 30.0


def _say(text: str) -> None:
    print(f"[trainhub] {text}", flush=True)


def build_strategy(federated: dict[str, Any], hparams: dict[str, Any]) -> Strategy:
    """The spec's strategy; hparams ``proximal_mu`` overrides ``federated.proximal_mu``."""
    clients = int(federated["clients"])
    minimum = int(federated.get("min_available_clients") or clients)
    fraction_fit = float(federated.get("fraction_fit", 1.0))
    fraction_evaluate = float(federated.get("fraction_evaluate", 1.0))
    name = str(federated.get("strategy", "fedavg"))
    mu = float(hparams.get("proximal_mu", federated.get("proximal_mu", 0.1)))
    rounds = int(federated["rounds"])
    scalars = {k: v for k, v in hparams.items() if isinstance(v, int | float | str | bool)}
    sent_mu = mu if name == "fedprox" else 0.0  # a client adds the proximal term when > 0

    def config(server_round: int) -> dict[str, Scalar]:
        # the round as the trial counts it is added by Tracked (a resumed run starts later)
        return {**scalars, "rounds": rounds, "strategy": name, "proximal_mu": sent_mu}

    common: dict[str, Any] = {
        "fraction_fit": fraction_fit,
        "fraction_evaluate": fraction_evaluate,
        "min_fit_clients": max(1, int(minimum * fraction_fit)),
        "min_evaluate_clients": max(1, int(minimum * fraction_evaluate)),
        "min_available_clients": minimum,
        "on_fit_config_fn": config,
        "on_evaluate_config_fn": config,
        "accept_failures": True,
        "fit_metrics_aggregation_fn": _weighted,
        "evaluate_metrics_aggregation_fn": _weighted,
    }
    if name == "fedprox":
        return FedProx(**common, proximal_mu=mu)
    if name == "fedadam":
        return FedAdam(
            **common,
            initial_parameters=ndarrays_to_parameters([]),  # set from round 0's model
            eta=float(federated.get("server_learning_rate", 0.01)),
        )
    return FedAvg(**common)


def _weighted(items: list[tuple[int, dict[str, Scalar]]]) -> dict[str, Scalar]:
    """The example-weighted mean of every numeric metric the clients return."""
    total = sum(n for n, _ in items) or 1
    names = {k for _, m in items for k, v in m.items() if _number(v)}
    names -= {"client"}
    return {k: sum(n * float(m.get(k, 0.0)) for n, m in items) / total for k in sorted(names)}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Tracked(Strategy):
    """The spec's strategy, timing its aggregation and numbering rounds as the trial does."""

    def __init__(self, inner: Strategy, offset: int) -> None:
        self.inner = inner
        self.offset = offset
        self.aggregate_s = 0.0

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None  # the server chooses: the checkpoint, else a client's model

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        chosen = self.inner.configure_fit(server_round, parameters, client_manager)
        for _, ins in chosen:
            ins.config["round"] = server_round + self.offset
        return chosen

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: Failures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        started = time.perf_counter()
        out = self.inner.aggregate_fit(server_round, results, failures)
        self.aggregate_s += time.perf_counter() - started
        return out

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        chosen = self.inner.configure_evaluate(server_round, parameters, client_manager)
        for _, ins in chosen:
            ins.config["round"] = server_round + self.offset
        return chosen

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: Failures,
    ) -> tuple[float | None, dict[str, Scalar]]:
        started = time.perf_counter()
        out = self.inner.aggregate_evaluate(server_round, results, failures)
        self.aggregate_s += time.perf_counter() - started
        return out

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return self.inner.evaluate(server_round, parameters)


class ReadyManager(SimpleClientManager):
    """Says once when enough clients are connected for the federation to run."""

    def __init__(self, minimum: int, on_ready: Callable[[int], None]) -> None:
        super().__init__()
        self._minimum = minimum
        self._on_ready = on_ready
        self._said = False

    def register(self, client: ClientProxy) -> bool:
        added = super().register(client)
        if added and not self._said and self.num_available() >= self._minimum:
            self._said = True
            self._on_ready(self.num_available())
        return added


class FederationServer(flwr.server.Server):
    """Flower's server loop with a trial's bookkeeping after every round."""

    def __init__(
        self,
        ctx: Context,
        federated: dict[str, Any],
        strategy: Tracked,
        manager: ClientManager,
        restored: dict[str, Any] | None,
    ) -> None:
        super().__init__(client_manager=manager, strategy=strategy)
        self.ctx = ctx
        self.federated = federated
        self.tracked = strategy
        self.restored = restored
        self.done = strategy.offset

    def _get_initial_parameters(self, server_round: int, timeout: float | None) -> Parameters:
        inner = self.tracked.inner
        if self.restored is not None:
            arrays = [t.numpy() for t in self.restored["parameters"]]
            if isinstance(inner, FedAdam):
                for name in ("m_t", "v_t"):
                    saved = self.restored.get(name)
                    setattr(inner, name, [t.numpy() for t in saved] if saved else None)
            _say(f"resumed from the checkpoint of round {self.done}")
        else:
            client = self._client_manager.sample(1)[0]
            res = client.get_parameters(GetParametersIns(config={}), timeout, server_round)
            if res.status.code != Code.OK:
                raise RuntimeError(f"no initial model from a client: {res.status.message}")
            arrays = parameters_to_ndarrays(res.parameters)
        if isinstance(inner, FedAdam):
            inner.current_weights = arrays
        return ndarrays_to_parameters(arrays)

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[flwr.server.History, float]:
        history = flwr.server.History()
        self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
        started = time.perf_counter()
        # a round's wall time runs from the end of the previous round's checkpoint: that
        # round's report and stop check count in this round's overhead
        began = started
        wanted = 0  # after a round in which clients failed: how many it began with
        for current in range(1, num_rounds + 1):
            round_no = current + self.done
            self.tracked.aggregate_s = 0.0
            marks = [time.perf_counter()]  # where the round's time goes (``phases``)
            if wanted:
                self._await_rejoin(wanted)
            marks.append(time.perf_counter())
            connected = self._client_manager.num_available()
            res_fit = self.fit_round(server_round=current, timeout=timeout)
            marks.append(time.perf_counter())
            fit_results: Results = []
            fit_failures: Failures = []
            if res_fit is not None:
                parameters, _, (fit_results, fit_failures) = res_fit
                if parameters:
                    self.parameters = parameters
            res_eval = self.evaluate_round(server_round=current, timeout=timeout)
            eval_results: Results = []
            eval_failures: Failures = []
            loss = None
            if res_eval is not None:
                loss, _, (eval_results, eval_failures) = res_eval
            marks.append(time.perf_counter())
            failed = fit_failures or eval_failures
            wanted = connected if failed or self._client_manager.num_available() < connected else 0
            # the round's metrics are queued before its checkpoint: the upload delivers what
            # was reported before registering it, so a server killed once the checkpoint is
            # visible (and resumed after this round) has lost none of them
            self._report(round_no, loss, fit_results, fit_failures, eval_results)
            self._checkpoint(round_no)
            marks.append(time.perf_counter())
            wall = marks[-1] - began
            phases = dict(
                zip(
                    ("rejoin_wait_s", "fit_round_s", "evaluate_round_s", "checkpoint_s"),
                    (b - a for a, b in itertools.pairwise(marks)),
                    strict=True,
                )
            )
            phases["bookkeeping_s"] = marks[0] - began  # the previous round's report, stop check
            self._report_time(round_no, wall, fit_results, eval_results, phases)
            self.ctx.set_progress(round_no, total=int(self.federated["rounds"]), unit="rounds")
            if self.ctx.should_stop():
                _say(f"stopping after round {round_no}: {self.ctx.stop_reason}")
                break
            began += wall  # the end of this round's checkpoint
        return history, time.perf_counter() - started

    def _await_rejoin(self, wanted: int) -> None:
        """Wait (at most ``federated.rejoin_wait_s``) for ``wanted`` clients after some failed:
        a killed client is restarted and rejoins; the round goes on without it once the wait
        is over."""
        have = self._client_manager.num_available()
        if have >= wanted:
            return
        wait_s = float(self.federated.get("rejoin_wait_s", REJOIN_WAIT_S))
        _say(f"waiting up to {wait_s:g} s for {wanted - have} client(s) to rejoin")
        if not self._client_manager.wait_for(wanted, timeout=int(wait_s)):
            have = self._client_manager.num_available()
            _say(f"going on with {have} clients")

    def _checkpoint(self, round_no: int) -> None:
        import torch

        arrays = parameters_to_ndarrays(self.parameters)
        state: dict[str, Any] = {
            "round": round_no,
            "parameters": [torch.from_numpy(a.copy()) for a in arrays],
        }
        inner = self.tracked.inner
        if isinstance(inner, FedAdam):
            for name in ("m_t", "v_t"):
                saved = getattr(inner, name)
                state[name] = [torch.from_numpy(a.copy()) for a in saved] if saved else None
        self.ctx.save_checkpoint(state, step=round_no)

    def _report(
        self,
        round_no: int,
        loss: float | None,
        fit_results: Results,
        fit_failures: Failures,
        eval_results: Results,
    ) -> None:
        """The round's aggregate and per-client metrics (its timing follows the checkpoint:
        :meth:`_report_time`)."""
        metrics: dict[str, float] = {}
        per_client: dict[int, dict[str, float]] = {}
        for results in (fit_results, eval_results):
            for _, res in results:
                number = int(res.metrics.get("client", -1))
                mine = per_client.setdefault(number, {})
                for name, value in res.metrics.items():
                    if name == "client" or not _number(value):
                        continue
                    if name == "bytes_received" and name in mine:
                        mine[name] += float(value)  # fit's and evaluate's downloads
                    else:
                        mine[name] = float(value)
                if isinstance(res, EvaluateRes):
                    mine["val_loss"] = float(res.loss)
        for number, values in sorted(per_client.items()):
            for name, value in values.items():
                if math.isfinite(value):
                    metrics[f"client{number}/{name}"] = value
        fit_n = sum(r.num_examples for _, r in fit_results) or 1
        for name in ("train_loss", "train_accuracy"):
            if any(name in r.metrics for _, r in fit_results):
                metrics[name] = (
                    sum(r.num_examples * float(r.metrics.get(name, 0.0)) for _, r in fit_results)
                    / fit_n
                )
        eval_n = sum(r.num_examples for _, r in eval_results) or 1
        if loss is not None:
            metrics["val_loss"] = float(loss)
        if any("accuracy" in r.metrics for _, r in eval_results):
            metrics["val_accuracy"] = (
                sum(r.num_examples * float(r.metrics.get("accuracy", 0.0)) for _, r in eval_results)
                / eval_n
            )
        sent = [float(r.metrics.get("bytes_sent", 0.0)) for _, r in fit_results]
        received = [v.get("bytes_received", 0.0) for v in per_client.values()]
        metrics.update(
            {
                "clients_fit": float(len(fit_results)),
                "clients_failed": float(len(fit_failures)),
                "clients_connected": float(self._client_manager.num_available()),
                "bytes_sent": sum(sent),
                "bytes_received": sum(received),
                "bytes_per_client": (sum(sent) + sum(received)) / max(1, len(per_client)),
            }
        )
        self.ctx.report(step=round_no, **metrics)
        failed = f", {len(fit_failures)} failed" if fit_failures else ""
        accuracy = metrics.get("val_accuracy")
        said = f", val_accuracy {accuracy:.4f}" if accuracy is not None else ""
        _say(f"round {round_no}: {len(fit_results)} clients trained{failed}{said}")

    def _report_time(
        self,
        round_no: int,
        wall: float,
        fit_results: Results,
        eval_results: Results,
        phases: dict[str, float],
    ) -> None:
        """Where the round's time went, its checkpoint included (merged into the round's
        metrics; lost only with a server killed between the two reports)."""
        fit_s = [float(r.metrics.get("fit_s", 0.0)) for _, r in fit_results]
        eval_s = [float(r.metrics.get("eval_s", 0.0)) for _, r in eval_results]
        overhead = wall - max(fit_s, default=0.0) - max(eval_s, default=0.0)
        self.ctx.report(
            step=round_no,
            **phases,
            round_s=wall,
            aggregate_s=self.tracked.aggregate_s,
            round_overhead_s=max(0.0, overhead - self.tracked.aggregate_s),
        )


def run(federated: dict[str, Any], address: str) -> int:
    """Serve the federation at ``address`` (host:port) for its remaining rounds."""
    # the runtime's context of a single process: the clients are no torch.distributed peers
    os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    import trainhub

    ctx = trainhub.init()
    restored = ctx.restore()
    done = int(restored["round"]) if restored else 0
    rounds = int(federated["rounds"])
    strategy = Tracked(build_strategy(federated, dict(ctx.hparams)), offset=done)
    minimum = int(federated.get("min_available_clients") or federated["clients"])
    connected = threading.Event()

    def ready(count: int) -> None:
        connected.set()
        _say(f"federation ready: {count} clients connected (min_available_clients {minimum})")

    manager = ReadyManager(minimum, ready)
    server = FederationServer(ctx, federated, strategy, manager, restored)
    if done >= rounds:
        _say(f"all {rounds} rounds were done before this attempt")
        ctx.close()
        return 0
    _say(f"server at {address}: rounds {done + 1}..{rounds}, strategy {federated['strategy']}")
    timeout = float(federated.get("round_timeout_s", 600.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        flwr.server.start_server(
            server_address=address,
            server=server,
            config=flwr.server.ServerConfig(num_rounds=rounds - done, round_timeout=timeout),
        )
    ctx.close()
    sys.stdout.flush()
    return 0
