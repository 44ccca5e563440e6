"""The trainhub runtime: what a training script imports.

A script written for trainhub::

    import trainhub

    ctx = trainhub.init(hparams={"lr": 0.01, "epochs": 10})
    model = ctx.prepare_model(Net())
    state = ctx.restore()
    for epoch in range(start, ctx.hparams["epochs"]):
        ...
        ctx.report(step=epoch, train_loss=loss, val_accuracy=acc)
        state = {"model": trainhub.runtime.unwrap_model(model).state_dict()}
        ctx.save_checkpoint(state, step=epoch)
        if ctx.should_stop():
            break

Launched by the control plane (``TRAINHUB_API_URL`` set) it ships metrics and checkpoints over
HTTP; run as plain ``python`` or ``torchrun`` it writes them to local files.

This package imports nothing heavy itself: the server side imports
:mod:`trainhub.runtime.protocol` and must not pay for torch. The names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainhub.runtime.checkpoints import CheckpointHandle
    from trainhub.runtime.context import Context, init
    from trainhub.runtime.distributed.strategies import AllReduceStrategy
    from trainhub.runtime.errors import QuotaExceeded
    from trainhub.runtime.model import BaseCommStrategy, unwrap_model
    from trainhub.runtime.options import RuntimeOptions
    from trainhub.runtime.sample_filter import apply_sample_filter

__all__ = [
    "AllReduceStrategy",
    "BaseCommStrategy",
    "CheckpointHandle",
    "Context",
    "QuotaExceeded",
    "RuntimeOptions",
    "apply_sample_filter",
    "init",
    "unwrap_model",
]

_LAZY = {
    "init": "trainhub.runtime.context",
    "Context": "trainhub.runtime.context",
    "CheckpointHandle": "trainhub.runtime.checkpoints",
    "QuotaExceeded": "trainhub.runtime.errors",
    "RuntimeOptions": "trainhub.runtime.options",
    "AllReduceStrategy": "trainhub.runtime.distributed.strategies",
    "BaseCommStrategy": "trainhub.runtime.model",
    "unwrap_model": "trainhub.runtime.model",
    "apply_sample_filter": "trainhub.runtime.sample_filter",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'trainhub.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
