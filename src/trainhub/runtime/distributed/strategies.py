"""Apply the spec's ``distributed`` section to a model: the one entry point the runtime calls.

Order (each step a keyword-only ``apply_*`` of this package): move to the device; activation
checkpointing; then FSDP, the parameter server, or DDP with the strategy's comm hook; mixed
precision is an object the training loop uses around forward/backward/step. In a process
without ``torch.distributed`` (world size 1) DDP strategies leave the model as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainhub.runtime.distributed import builtin_hooks
from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.config import DistributedConfig
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


@dataclass
class PreparedModel:
    """A model with its strategy applied, and what the training loop needs alongside it.

    Attributes:
        model: call this in forward (DDP/FSDP-wrapped, or the module itself).
        config: the section it was prepared with.
        device: where parameters and inputs live.
        meter: bytes communicated and waiting time, for :class:`StepTimer`.
        precision: autocast / gradient scaler for the configured precision.
        hook_state: the DDP comm hook's state (residuals, step counter), if any.
        averager: the model averager of ``localsgd`` (blocking, or overlapped with
            ``localsgd.overlap``).
        ps_client: the parameter-server client of ``ps``.
    """

    model: nn.Module
    config: DistributedConfig
    device: torch.device
    meter: CommMeter
    precision: MixedPrecision
    hook_state: Any = None
    averager: MeteredPeriodicAverager | OverlappedAverager | None = None
    ps_client: Any = None
    world_size: int = 1
    _extra: dict[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> nn.Module:
        """The user's module without the DDP wrapper (for ``state_dict`` and checkpoints)."""
        inner = self.model.module if isinstance(self.model, DistributedDataParallel) else None
        return inner if isinstance(inner, nn.Module) else self.model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """What every rank must step instead of ``optimizer`` under this strategy.

        ``localsgd``: the optimizer followed by periodic model averaging. ``ps``: an optimizer
        that pushes gradients to the shards and pulls the new weights (the given optimizer must
        be SGD; its lr, momentum and weight decay are applied on the shards). Others: unchanged.
        """
        if self.averager is not None:
            return wrap_local_sgd_optimizer(optimizer, self.averager)
        if self.ps_client is not None:
            from trainhub.runtime.distributed.ps.optimizer import ParameterServerOptimizer

            ps_optimizer: torch.optim.Optimizer = ParameterServerOptimizer(
                optimizer, self.ps_client, meter=self.meter
            )
            return ps_optimizer
        return optimizer

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
        if isinstance(self.averager, OverlappedAverager):
            self.averager.flush()
        if self.averager is not None:
            average_replicas(self.model.parameters(), self.meter, self.averager.process_group)

    def make_accumulator(self) -> GradientAccumulator:
        return GradientAccumulator(self.model, self.config.large_batch.accumulation_steps)


def apply_strategy(
    model: nn.Module,
    config: DistributedConfig,
    *,
    device: torch.device | str,
    process_group: dist.ProcessGroup | None = None,
    ps_name: str | None = None,
) -> PreparedModel:
    """Prepare ``model`` for the trial's strategy. Call on every rank, the same way.

    Args:
        model: the user's module, on any device.
        config: the parsed ``distributed`` section (:meth:`DistributedConfig.from_env`).
        device: this rank's device (``cuda:LOCAL_RANK`` or ``cpu``).
        process_group: DDP's group; default the world.
        ps_name: ``ps`` only: a name unique to the trial for the shard actors.

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
    if config.memory.fsdp:
        prepared.model = apply_fsdp(model, device=device, precision=config.memory.precision)
    elif config.strategy == "ps":
        from trainhub.runtime.distributed.ps.client import connect_parameter_server

        prepared.ps_client = connect_parameter_server(model, config.ps, name=ps_name, meter=meter)
    elif world_size > 1:
        apply_ddp(prepared, process_group=process_group)
    return prepared


def apply_ddp(prepared: PreparedModel, *, process_group: dist.ProcessGroup | None) -> None:
    """Wrap ``prepared.model`` in DDP and register the strategy's comm hook."""
    config = prepared.config
    device = prepared.device
    ddp = DistributedDataParallel(
        prepared.model,
        device_ids=[device.index] if device.type == "cuda" and device.index is not None else None,
        process_group=process_group,
        bucket_cap_mb=config.bucket_cap_mb,
        find_unused_parameters=config.find_unused_parameters,
        gradient_as_bucket_view=True,
    )
    state, hook = make_comm_hook(config, prepared.meter, process_group)
    ddp.register_comm_hook(state, hook)
    release_at_exit(ddp)
    prepared.model = ddp
    prepared.hook_state = state
    if config.strategy == "localsgd":
        averager = OverlappedAverager if config.localsgd.overlap else MeteredPeriodicAverager
        prepared.averager = averager(
            period=config.localsgd.period,
            warmup_steps=config.localsgd.start_step,
            meter=prepared.meter,
            process_group=process_group,
        )


def make_comm_hook(
    config: DistributedConfig, meter: CommMeter, group: dist.ProcessGroup | None
) -> tuple[Any, Any]:
    """The ``(state, hook)`` pair DDP registers for ``config.strategy``."""
    strategy = config.strategy
    if strategy == "allreduce":
        return builtin_hooks.allreduce_state(meter, group), builtin_hooks.metered_hook
    if strategy == "fp16":
        return builtin_hooks.fp16_state(meter, group), builtin_hooks.metered_hook
    if strategy == "bf16":
        return builtin_hooks.bf16_state(meter, group), builtin_hooks.metered_hook
    if strategy == "powersgd":
        p = config.powersgd
        state = builtin_hooks.powersgd_state(
            meter,
            group,
            rank=p.rank,
            start_step=p.start_step,
            min_compression_rate=p.min_compression_rate,
            error_feedback=p.error_feedback,
            warm_start=p.warm_start,
        )
        return state, builtin_hooks.metered_hook
    if strategy == "localsgd":
        state = builtin_hooks.post_local_state(meter, group, start_step=config.localsgd.start_step)
        return state, builtin_hooks.metered_hook
    if strategy == "onebit":
        o = config.onebit
        return (
            OneBitState(
                group, start_step=o.start_step, error_feedback=o.error_feedback, meter=meter
            ),
            onebit_hook,
        )
    if strategy == "topk":
        t = config.topk
        topk_state = TopKState(
            group,
            density=t.density,
            warmup_steps=t.warmup_steps,
            start_step=t.start_step,
            error_feedback=t.error_feedback,
            meter=meter,
        )
        return topk_state, topk_hook
    raise ValueError(f"strategy {strategy!r} is not a DDP comm strategy")
