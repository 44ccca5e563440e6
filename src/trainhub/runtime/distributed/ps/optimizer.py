"""The optimizer a worker steps under strategy ``ps``: the update happens on the shards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.ps.client import ParameterServerClient
from trainhub.runtime.distributed.ps.shard import Hyper


def shard_hyper(optimizer: torch.optim.Optimizer) -> Hyper:
    """What the shards need to run ``optimizer``'s update (its one group's current values).

    Raises:
        ValueError: an optimizer the shards do not implement, or several parameter groups.
    """
    if len(optimizer.param_groups) != 1:
        raise ValueError(
            "strategy 'ps' runs the optimizer on the shards over one flat vector: pass an "
            f"optimizer with one parameter group (got {len(optimizer.param_groups)})"
        )
    group = optimizer.param_groups[0]
    lr, weight_decay = float(group["lr"]), float(group.get("weight_decay", 0.0))
    if isinstance(optimizer, torch.optim.SGD):
        return Hyper(
            lr=lr,
            momentum=float(group.get("momentum", 0.0)),
            weight_decay=weight_decay,
            dampening=float(group.get("dampening", 0.0)),
            nesterov=bool(group.get("nesterov", False)),
        )
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        if group.get("amsgrad"):
            raise ValueError("strategy 'ps' does not implement amsgrad; set amsgrad=False")
        decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(
            group.get("decoupled_weight_decay", False)
        )
        beta1, beta2 = group["betas"]
        return Hyper(
            lr=lr,
            weight_decay=weight_decay,
            kind="adamw" if decoupled else "adam",
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
        )
    raise ValueError(
        "strategy 'ps' runs the optimizer on the parameter shards, which implement "
        f"torch.optim.SGD, Adam and AdamW; got {type(optimizer).__name__}"
    )


class ParameterServerOptimizer(torch.optim.Optimizer):
    """Sends the gradients to the shards, which apply the update; loads the weights they return.

    It shares ``param_groups`` with the optimizer it wraps (``torch.optim.SGD``, ``Adam`` or
    ``AdamW``, one group), so learning-rate schedulers keep working: each push carries the
    group's current hyperparameters. The optimizer's state (momentum, Adam's moments) lives on
    the shards.

    Args:
        optimizer: the optimizer over the model's parameters, one parameter group.
        client: this worker's :class:`ParameterServerClient`.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        client: ParameterServerClient,
        *,
        meter: CommMeter | None = None,
    ) -> None:
        shard_hyper(optimizer)  # refuse what the shards cannot run, before the first step
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
        for pre_hook in list(self._optimizer_step_pre_hooks.values()):
            pre_hook(self.optimizer, (), {})
        self.client.step(shard_hyper(self.optimizer))
        for post_hook in list(self._optimizer_step_post_hooks.values()):
            post_hook(self.optimizer, (), {})
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
