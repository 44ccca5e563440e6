"""The built-in communication strategies, one :class:`BaseCommStrategy` per spec name, and
:func:`apply_strategy`, the one entry point the runtime calls.

Each class owns its config (the nested section of :class:`DistributedConfig` named in
:data:`~trainhub.distributed_contract.STRATEGY_CONFIGS`); :data:`COMM_STRATEGIES` maps every
name of ``distributed.strategy`` to its class and is checked against the contract at import, so
a strategy cannot exist in the spec without existing here.

Order of :func:`apply_strategy` (each step a keyword-only ``apply_*`` of this package): move to
the device; activation checkpointing; then FSDP, or the strategy's ``wrap`` (DDP with the
strategy's comm hook, or the parameter server); mixed precision is an object the training loop
uses around forward/backward/step. In a process without ``torch.distributed`` (world size 1) DDP
strategies leave the model as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainhub.runtime.distributed import builtin_hooks
from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.config import STRATEGY_CONFIGS, DistributedConfig
from trainhub.runtime.distributed.fp16 import ScaledFP16State, scaled_fp16_hook
from trainhub.runtime.distributed.large_batch import (
    GradientAccumulator,
    linear_scaled_lr,
    linear_scaling_warmup,
)
from trainhub.runtime.distributed.localsgd import (
    MeteredPeriodicAverager,
    average_replicas,
    wrap_local_sgd_optimizer,
)
from trainhub.runtime.distributed.memory import (
    MixedPrecision,
    apply_activation_checkpointing,
    apply_fsdp,
)
from trainhub.runtime.distributed.onebit import OneBitState, onebit_hook
from trainhub.runtime.distributed.optim import build_optimizer
from trainhub.runtime.distributed.overlap_averager import OverlappedAverager
from trainhub.runtime.distributed.teardown import release_at_exit
from trainhub.runtime.distributed.topk import TopKState, topk_hook
from trainhub.runtime.model import BaseCommStrategy


class BuiltinCommStrategy(BaseCommStrategy):
    """A strategy the spec can name: built from the section, metered, in a process group.

    Args:
        section: the whole ``distributed`` section (``bucket_cap_mb`` etc. and the
            strategy's own nested config).
        meter: receives bytes sent and communication waits.
        process_group: the group to train in; default the world.
    """

    def __init__(
        self,
        section: DistributedConfig,
        *,
        meter: CommMeter | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.section = section
        self.meter = meter if meter is not None else CommMeter()
        self.process_group = process_group


class AllReduceStrategy(BuiltinCommStrategy):
    """DDP with fp32 gradients averaged by ring all-reduce; the base of every DDP strategy.

    Subclasses change the gradient exchange by overriding :meth:`make_hook`.
    """

    name = "allreduce"

    def __init__(
        self,
        section: DistributedConfig | None = None,
        *,
        meter: CommMeter | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(
            section if section is not None else DistributedConfig(),
            meter=meter,
            process_group=process_group,
        )
        self.hook_state: Any = None

    def make_hook(self) -> tuple[Any, Any]:
        """The ``(state, hook)`` pair DDP registers."""
        return builtin_hooks.allreduce_state(self.meter, self.process_group), (
            builtin_hooks.metered_hook
        )

    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        ddp = DistributedDataParallel(
            model,
            device_ids=[device.index]
            if device.type == "cuda" and device.index is not None
            else None,
            process_group=self.process_group,
            bucket_cap_mb=self.section.bucket_cap_mb,
            find_unused_parameters=self.section.find_unused_parameters,
            gradient_as_bucket_view=True,
        )
        # DDP broadcast the module's state from rank 0 as it was made: on the wire too
        # (docs/adr/0045: the hooks' figure is reconciled with the kernel's)
        if dist.is_initialized():
            group = self.process_group
            state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            self.meter.add_broadcast(state_bytes, dist.get_world_size(group), dist.get_rank(group))
        state, hook = self.make_hook()
        ddp.register_comm_hook(state, hook)
        self.hook_state = state
        return ddp


class FP16Strategy(AllReduceStrategy):
    """Gradients travel as float16, scaled so they neither overflow nor underflow."""

    name = "fp16"

    def make_hook(self) -> tuple[Any, Any]:
        return ScaledFP16State(self.process_group, self.meter), scaled_fp16_hook


class BF16Strategy(AllReduceStrategy):
    """Gradients travel as bfloat16 (PyTorch's hook)."""

    name = "bf16"

    def make_hook(self) -> tuple[Any, Any]:
        return builtin_hooks.bf16_state(self.meter, self.process_group), (
            builtin_hooks.metered_hook
        )


class PowerSGDStrategy(AllReduceStrategy):
    """Low-rank gradients (PyTorch's PowerSGD hook); config ``distributed.powersgd``."""

    name = "powersgd"

    def make_hook(self) -> tuple[Any, Any]:
        p = self.section.powersgd
        state = builtin_hooks.powersgd_state(
            self.meter,
            self.process_group,
            rank=p.rank,
            start_step=p.start_step,
            min_compression_rate=p.min_compression_rate,
            error_feedback=p.error_feedback,
            warm_start=p.warm_start,
        )
        return state, builtin_hooks.metered_hook


class _MomentumCorrected(AllReduceStrategy):
    """A compressing strategy that can take over the optimizer's momentum (see
    :mod:`~trainhub.runtime.distributed.error_feedback`)."""

    momentum_correction = False

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not self.momentum_correction or self.hook_state is None:
            return optimizer
        momenta = {float(g.get("momentum", 0.0)) for g in optimizer.param_groups}
        if not isinstance(optimizer, torch.optim.SGD) or len(momenta) != 1:
            return optimizer  # Adam-like or mixed momenta: compress the gradient as it is
        momentum = momenta.pop()
        if momentum <= 0.0 or any(g.get("nesterov") for g in optimizer.param_groups):
            return optimizer
        self.hook_state.momentum = momentum
        for group in optimizer.param_groups:
            group["momentum"] = 0.0  # the hook applies it, before compressing
        return optimizer


class OneBitStrategy(_MomentumCorrected):
    """Sign bits and one scale per tensor, error feedback; config ``distributed.onebit``."""

    name = "onebit"

    def make_hook(self) -> tuple[Any, Any]:
        o = self.section.onebit
        self.momentum_correction = o.momentum_correction
        state = OneBitState(
            self.process_group,
            block_size=o.block_size,
            start_step=o.start_step,
            error_feedback=o.error_feedback,
            meter=self.meter,
        )
        return state, onebit_hook


class TopKStrategy(_MomentumCorrected):
    """The largest gradient entries, error feedback, density warm-up; ``distributed.topk``."""

    name = "topk"

    def make_hook(self) -> tuple[Any, Any]:
        t = self.section.topk
        self.momentum_correction = t.momentum_correction
        state = TopKState(
            self.process_group,
            density=t.density,
            warmup_steps=t.warmup_steps,
            start_step=t.start_step,
            error_feedback=t.error_feedback,
            meter=self.meter,
        )
        return state, topk_hook


class LocalSGDStrategy(AllReduceStrategy):
    """Post-local SGD with periodic (optionally overlapped) model averaging;
    config ``distributed.localsgd``. Replicas differ between averagings: the runtime averages
    them before a checkpoint is saved and :meth:`average_replicas` does it on demand."""

    name = "localsgd"

    def __init__(
        self,
        section: DistributedConfig | None = None,
        *,
        meter: CommMeter | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(section, meter=meter, process_group=process_group)
        self.averager: MeteredPeriodicAverager | OverlappedAverager | None = None
        self._parameters: list[nn.Parameter] = []

    def make_hook(self) -> tuple[Any, Any]:
        start = self.section.localsgd.start_step
        state = builtin_hooks.post_local_state(self.meter, self.process_group, start_step=start)
        return state, builtin_hooks.metered_hook

    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        ddp = super().wrap(model, device=device)
        config = self.section.localsgd
        averager = OverlappedAverager if config.overlap else MeteredPeriodicAverager
        self.averager = averager(
            period=config.period,
            warmup_steps=config.start_step,
            meter=self.meter,
            process_group=self.process_group,
        )
        self._parameters = list(ddp.parameters())
        return ddp

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if self.averager is None:
            return optimizer
        return wrap_local_sgd_optimizer(optimizer, self.averager)

    def average_replicas(self) -> None:
        if self.averager is None:
            return
        if isinstance(self.averager, OverlappedAverager):
            self.averager.flush()
        average_replicas(self._parameters, self.meter, self.averager.process_group)


class ParameterServerStrategy(BuiltinCommStrategy):
    """Parameter shards hosted by the trial's ranks; config ``distributed.ps``. The model is
    not wrapped: the optimizer pushes gradients and loads the weights the shards return."""

    name = "ps"
    wraps_single_process = True

    def __init__(
        self,
        section: DistributedConfig,
        *,
        meter: CommMeter | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(section, meter=meter, process_group=process_group)
        self.client: Any = None

    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        from trainhub.runtime.distributed.ps.client import connect_parameter_server

        self.client = connect_parameter_server(model, self.section.ps, meter=self.meter)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        from trainhub.runtime.distributed.ps.optimizer import ParameterServerOptimizer

        ps_optimizer: torch.optim.Optimizer = ParameterServerOptimizer(
            optimizer, self.client, meter=self.meter
        )
        return ps_optimizer

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


#: Every built-in strategy by the name ``distributed.strategy`` gives it.
COMM_STRATEGIES: dict[str, type[BuiltinCommStrategy]] = {
    cls.name: cls
    for cls in (
        AllReduceStrategy,
        FP16Strategy,
        BF16Strategy,
        PowerSGDStrategy,
        OneBitStrategy,
        TopKStrategy,
        LocalSGDStrategy,
        ParameterServerStrategy,
    )
}
if set(COMM_STRATEGIES) != set(STRATEGY_CONFIGS):  # pragma: no cover - a programming error
    raise RuntimeError(
        f"runtime strategies {sorted(COMM_STRATEGIES)} differ from the spec's "
        f"{sorted(STRATEGY_CONFIGS)}"
    )


def make_comm_strategy(
    config: DistributedConfig,
    *,
    meter: CommMeter | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> BuiltinCommStrategy:
    """The strategy ``config.strategy`` names, configured from the section."""
    cls = COMM_STRATEGIES[config.strategy]
    return cls(config, meter=meter, process_group=process_group)


def make_comm_hook(
    config: DistributedConfig, meter: CommMeter, group: dist.ProcessGroup | None
) -> tuple[Any, Any]:
    """The ``(state, hook)`` pair DDP registers for ``config.strategy`` (for a DDP you built)."""
    strategy = make_comm_strategy(config, meter=meter, process_group=group)
    if not isinstance(strategy, AllReduceStrategy):
        raise ValueError(f"strategy {config.strategy!r} is not a DDP comm strategy")
    return strategy.make_hook()


@dataclass
class PreparedModel:
    """A model with its strategy applied, and what the training loop needs alongside it.

    Attributes:
        model: call this in forward (DDP/FSDP-wrapped, or the module itself).
        config: the section it was prepared with.
        device: where parameters and inputs live.
        meter: bytes communicated and waiting time, for :class:`StepTimer`.
        precision: autocast / gradient scaler for the configured precision.
        strategy: the communication strategy that wrapped the model (None under FSDP).
        world_size: ranks in the process group.
    """

    model: nn.Module
    config: DistributedConfig
    device: torch.device
    meter: CommMeter
    precision: MixedPrecision
    strategy: BaseCommStrategy | None = None
    world_size: int = 1

    @property
    def module(self) -> nn.Module:
        """The user's module without the DDP wrapper (for ``state_dict`` and checkpoints)."""
        inner = self.model.module if isinstance(self.model, DistributedDataParallel) else None
        return inner if isinstance(inner, nn.Module) else self.model

    @property
    def is_fsdp(self) -> bool:
        return bool(self.config.memory.fsdp) and self.world_size > 1

    @property
    def hook_state(self) -> Any:
        """The DDP comm hook's state (residuals, step counter), if any."""
        return getattr(self.strategy, "hook_state", None)

    @property
    def averager(self) -> MeteredPeriodicAverager | OverlappedAverager | None:
        """The model averager of ``localsgd``."""
        return getattr(self.strategy, "averager", None)

    @property
    def ps_client(self) -> Any:
        """The parameter-server client of ``ps``."""
        return getattr(self.strategy, "client", None)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """What every rank must step instead of ``optimizer`` under this strategy.

        ``localsgd``: the optimizer followed by periodic model averaging. ``ps``: an optimizer
        that pushes gradients to the shards and pulls the new weights (SGD or Adam/AdamW, one
        parameter group; the update runs on the shards). Others: unchanged.
        """
        if self.strategy is None:
            return optimizer
        return self.strategy.wrap_optimizer(optimizer)

    def make_optimizer(
        self, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, **extra: Any
    ) -> torch.optim.Optimizer:
        """The spec's ``large_batch.optimizer`` over this model's parameters, wrapped for the
        strategy. ``lr`` is the base rate; see :meth:`make_lr_scheduler` for scaling."""
        optimizer = build_optimizer(
            self.config.large_batch.optimizer,
            self.model.parameters(),
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            **extra,
        )
        return self.wrap_optimizer(optimizer)

    def global_batch_size(self, per_rank_batch_size: int) -> int:
        return per_rank_batch_size * self.world_size * self.config.large_batch.accumulation_steps

    def make_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, *, per_rank_batch_size: int
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """Linear scaling rule with gradual warm-up as the spec asks; step once per step."""
        spec = self.config.large_batch
        scale = 1.0
        if spec.lr_scaling == "linear":
            global_batch = self.global_batch_size(per_rank_batch_size)
            scale = linear_scaled_lr(1.0, global_batch, spec.reference_batch_size)
        return linear_scaling_warmup(optimizer, scale=scale, warmup_steps=spec.warmup_steps)

    def average_replicas(self) -> None:
        """``localsgd``: make every rank's parameters their average now. Call on every rank
        after the last step (and before evaluating or checkpointing mid-period): between two
        averagings the replicas differ. A no-op for other strategies, whose replicas agree."""
        if self.strategy is not None:
            self.strategy.average_replicas()

    def make_accumulator(self) -> GradientAccumulator:
        return GradientAccumulator(self.model, self.config.large_batch.accumulation_steps)

    def close(self) -> None:
        """Release what the strategy started (the parameter-server shards); every rank."""
        if self.strategy is not None:
            self.strategy.close()


def apply_strategy(
    model: nn.Module,
    config: DistributedConfig,
    *,
    device: torch.device | str,
    process_group: dist.ProcessGroup | None = None,
    strategy: BaseCommStrategy | None = None,
) -> PreparedModel:
    """Prepare ``model`` for the trial's strategy. Call on every rank, the same way.

    Args:
        model: the user's module, on any device.
        config: the parsed ``distributed`` section (:meth:`DistributedConfig.from_env`).
        device: this rank's device (``cuda:LOCAL_RANK`` or ``cpu``).
        process_group: DDP's group; default the world.
        strategy: a strategy of your own instead of the one ``config.strategy`` names (the
            section's memory and large-batch options still apply).

    Raises:
        ValueError: an option the device or the world cannot honour (fp16 on CPU, FSDP without
            ``torch.distributed``).

    Example:
        >>> prepared = apply_strategy(Net(), DistributedConfig.from_env(), device="cpu")
        >>> optimizer = prepared.make_optimizer(lr=0.1)
    """
    device = torch.device(device)
    precision = MixedPrecision(config.memory.precision, device)
    meter = CommMeter()
    world_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
    model = model.to(device)
    if config.memory.activation_checkpointing:
        apply_activation_checkpointing(model)
    prepared = PreparedModel(model, config, device, meter, precision, world_size=world_size)
    if config.memory.fsdp and strategy is None:
        prepared.model = apply_fsdp(model, device=device, precision=config.memory.precision)
        return prepared
    if strategy is None:
        strategy = make_comm_strategy(config, meter=meter, process_group=process_group)
    elif isinstance(strategy, BuiltinCommStrategy):
        prepared.meter = strategy.meter
    prepared.strategy = strategy
    if world_size > 1 or strategy.wraps_single_process:
        prepared.model = strategy.wrap(model, device=device)
        if isinstance(prepared.model, DistributedDataParallel):
            release_at_exit(prepared.model)
    return prepared
