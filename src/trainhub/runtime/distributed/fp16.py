"""float16 gradients on the wire without overflow or underflow: a scaled fp16 DDP comm hook.

PyTorch's ``fp16_compress_hook`` casts each bucket to float16 and divides by the world size.
float16 holds magnitudes from 6e-8 (2^-24, subnormal below 6e-5) to 65504: a gradient entry
above 65504 becomes ``inf`` (gradients under fp16 autocast are multiplied by the GradScaler's
scale, 65536 at first, so this happens in the first steps of every such run, and each overflow
skips an optimizer step), and entries far below 6e-5 lose their precision or vanish. This hook
first agrees with the other ranks on the bucket's largest magnitude (one all-reduce of a single
float32, ``MAX``), multiplies the bucket by the power of two that puts the *sum over ranks* of
that magnitude at 2^15, casts, all-reduces in float16, and divides by the same power of two and
the world size when decoding. Powers of two make the scaling exact; the sum cannot overflow;
small entries keep 2^15 / max of headroom instead of 65504 / max. Non-finite gradients (an fp16
autocast step that overflowed in backward) are sent unscaled, so the GradScaler still sees them.
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations against real types
import math

import torch
import torch.distributed as dist

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.error_feedback import GradBucket

TARGET_MAX = 2.0**15  # the largest magnitude a summed entry may reach (fp16 max is 65504)


class ScaledFP16State:
    """State of :func:`scaled_fp16_hook`: the group and the meter."""

    def __init__(
        self, process_group: dist.ProcessGroup | None = None, meter: CommMeter | None = None
    ) -> None:
        self.process_group = process_group
        self.meter = meter if meter is not None else CommMeter()

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)


def wire_scale(global_max: float, world_size: int) -> float:
    """The power of two that maps ``world_size * global_max`` to at most :data:`TARGET_MAX`."""
    if not math.isfinite(global_max) or global_max <= 0.0:
        return 1.0
    exponent = math.floor(math.log2(TARGET_MAX / (world_size * global_max)))
    return float(2.0 ** max(-100, min(100, exponent)))


def scaled_fp16_hook(
    state: ScaledFP16State, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the ranks' mean gradient, sent as float16 scaled to use its range.

    Register on every rank: ``ddp.register_comm_hook(ScaledFP16State(), scaled_fp16_hook)``.
    """
    buffer = bucket.buffer()
    world_size = state.world_size
    if bucket.is_last():
        state.meter.mark_gradients_ready()
    peak = buffer.detach().abs().max().to(torch.float32).reshape(1)
    state.meter.add_allreduce(peak.numel() * peak.element_size(), world_size)
    with state.meter.sync():
        # every rank scales by the same power of two; a tiny blocking all-reduce, issued in
        # bucket order like every other collective of the hook
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=state.process_group)
    scale = wire_scale(float(peak.item()), world_size)
    compressed = buffer.mul(scale).to(torch.float16)
    state.meter.add_allreduce(compressed.numel() * compressed.element_size(), world_size)
    work = dist.all_reduce(compressed, group=state.process_group, async_op=True)
    assert work is not None

    def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        total = fut.value()[0]
        buffer.copy_(total.to(buffer.dtype).div_(scale * world_size))
        return buffer

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(decompress)
    return future
