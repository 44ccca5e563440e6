"""Memory options: mixed precision, activation checkpointing, FSDP.

All three are PyTorch's own: ``torch.autocast`` and ``torch.amp.GradScaler``; the checkpoint
wrapper FSDP documents for activation checkpointing; FSDP2's ``fully_shard``. What this module
adds is the choice of blocks (a model of the zoo names its blocks in ``checkpoint_block_types``;
for other models, the elements of every ``nn.ModuleList``) and one object that hides whether a
gradient scaler is in play.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as _ptd_apply_activation_checkpointing,
)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecision:
    """Autocast and, for float16, a gradient scaler; a no-op for ``fp32``.

    ``bf16`` autocasts on CPU and GPU; ``fp16`` needs a GPU (CPU float16 kernels are slow and a
    scaler is needed against underflow). Use it on every rank::

        with precision.autocast():
            loss = loss_fn(model(x), y)
        precision.backward(loss)
        precision.step(optimizer)
    """

    def __init__(self, precision: str, device: torch.device) -> None:
        if precision not in _DTYPES:
            raise ValueError(f"precision must be one of fp32, bf16, fp16; got {precision!r}")
        if precision == "fp16" and device.type != "cuda":
            raise ValueError(
                "memory.precision 'fp16' needs a GPU (it uses a gradient scaler); use 'bf16' on CPU"
            )
        self.name = precision
        self.dtype = _DTYPES[precision]
        self.device = device
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    @property
    def enabled(self) -> bool:
        return self.name != "fp32"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        scaled.backward()  # type: ignore[no-untyped-call]

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Call before gradient clipping so norms are in real units."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def block_types(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The module classes that form a model's repeated blocks.

    A model names them in a ``checkpoint_block_types`` attribute (the zoo's models do);
    otherwise they are the classes of the elements of the model's ``nn.ModuleList``\\s.
    """
    declared = getattr(model, "checkpoint_block_types", None)
    if declared:
        return tuple(declared)
    found: list[type[nn.Module]] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            found.extend(type(child) for child in module if type(child) not in found)
    return tuple(found)


def apply_activation_checkpointing(
    model: nn.Module, *, types: tuple[type[nn.Module], ...] | None = None
) -> int:
    """Recompute the activations of every block in backward; returns how many were wrapped.

    Raises:
        ValueError: the model has no recognisable blocks.
    """
    chosen = types if types is not None else block_types(model)
    if not chosen:
        raise ValueError(
            f"memory.activation_checkpointing: cannot find the blocks of {type(model).__name__}; "
            "give the model a `checkpoint_block_types` attribute (a tuple of block classes) or "
            "keep its blocks in an nn.ModuleList"
        )
    count = sum(1 for m in model.modules() if isinstance(m, chosen))
    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    _ptd_apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, chosen)
    )
    return count


def apply_fsdp(
    model: nn.Module,
    *,
    device: torch.device,
    precision: str = "fp32",
    types: tuple[type[nn.Module], ...] | None = None,
) -> nn.Module:
    """Shard parameters, gradients and optimizer state over all ranks (FSDP2 ``fully_shard``).

    Every block is its own FSDP unit (its parameters are gathered just before it runs and freed
    after), then the root. With ``bf16`` parameters compute in bfloat16 and gradients are
    reduced in float32. Call on every rank, after ``torch.distributed`` is initialised and the
    model is on ``device``; build the optimizer afterwards (parameters become DTensors).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise ValueError("memory.fsdp needs torch.distributed to be initialised (world size > 1)")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if precision in ("bf16", "fp16"):
        policy = MixedPrecisionPolicy(param_dtype=_DTYPES[precision], reduce_dtype=torch.float32)
    chosen = types if types is not None else block_types(model)
    blocks = [m for m in model.modules() if chosen and isinstance(m, chosen)]
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
