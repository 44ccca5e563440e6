"""The communication-strategy extension point, and how to reach the user's module inside it.

:meth:`Context.prepare_model <trainhub.runtime.context.Context.prepare_model>` moves the model to
its device and hands it to a :class:`BaseCommStrategy`. The built-in strategies (one per name of
the spec's ``distributed.strategy``, each with its own nested config) are registered in
:data:`trainhub.runtime.distributed.strategies.COMM_STRATEGIES`; a script may pass its own
subclass to ``prepare_model(strategy=...)`` instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class BaseCommStrategy(ABC):
    """Wraps a model so that its ranks exchange gradients (or weights) in some way.

    Implement :meth:`wrap`; override :meth:`wrap_optimizer` when the optimizer step must do
    more (local SGD averages, a parameter server pushes and pulls) and :meth:`average_replicas`
    when replicas may differ between steps. Every method is called on every rank, the same way.

    Example:
        >>> class PlainDDP(BaseCommStrategy):
        ...     name = "plain-ddp"
        ...     def wrap(self, model, *, device):
        ...         return DistributedDataParallel(model)
        >>> model = ctx.prepare_model(Net(), strategy=PlainDDP())  # doctest: +SKIP
    """

    name: ClassVar[str]
    #: call :meth:`wrap` in a process without peers too (e.g. to reach a server)
    wraps_single_process: ClassVar[bool] = False

    @abstractmethod
    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        """Return the module to train; ``model`` is already on ``device``.

        Called on every rank, with the process group set up and world size > 1 (unless
        :attr:`wraps_single_process`).
        """

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer every rank must step instead of ``optimizer`` (default: itself)."""
        return optimizer

    def average_replicas(self) -> None:
        """Make every rank's parameters equal now, if the strategy lets them drift apart.

        A collective (every rank calls it at the same point); a no-op by default.
        """
        return

    def close(self) -> None:
        """Release what :meth:`wrap` started (every rank, after the last step)."""
        return


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP (or similar) wrapper; the model itself if unwrapped.

    Save ``unwrap_model(model).state_dict()`` so checkpoints load the same way with one rank
    (no wrapper) and with many.
    """
    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model
