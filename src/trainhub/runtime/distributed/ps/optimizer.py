"""The optimizer a worker steps under strategy ``ps``: the update happens on the shards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.ps.client import ParameterServerClient
from trainhub.runtime.distributed.ps.shard import Hyper


class ParameterServerOptimizer(torch.optim.Optimizer):
    """Sends the gradients to the shards, which apply SGD; loads the weights they return.

    It shares ``param_groups`` with the SGD optimizer it wraps, so learning-rate schedulers keep
    working: each push carries the current ``lr``, ``momentum`` and ``weight_decay``.

    Args:
        optimizer: a ``torch.optim.SGD`` over the model's parameters, one parameter group.
        client: this worker's :class:`ParameterServerClient`.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        client: ParameterServerClient,
        *,
        meter: CommMeter | None = None,
    ) -> None:
        if not isinstance(optimizer, torch.optim.SGD) or len(optimizer.param_groups) != 1:
            raise ValueError(
                "strategy 'ps' applies SGD on the shards: pass a torch.optim.SGD with one "
                f"parameter group (got {type(optimizer).__name__} with "
                f"{len(optimizer.param_groups)} groups)"
            )
        if optimizer.param_groups[0].get("nesterov"):
            raise ValueError("strategy 'ps' does not support nesterov momentum")
        self.optimizer = optimizer
        self.client = client
        if meter is not None:
            client.meter = meter
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state = optimizer.state
        self._optimizer_step_pre_hooks = optimizer._optimizer_step_pre_hooks
        self._optimizer_step_post_hooks = optimizer._optimizer_step_post_hooks

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        hyper = Hyper(
            lr=float(group["lr"]),
            momentum=float(group.get("momentum", 0.0)),
            weight_decay=float(group.get("weight_decay", 0.0)),
        )
        self.client.step(hyper)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        state["ps_clock"] = self.client.clock
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self.client.clock = int(state.pop("ps_clock", 0))
        self.optimizer.load_state_dict(state)
