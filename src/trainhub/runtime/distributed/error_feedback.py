"""What the compressing DDP comm hooks of this package share: error feedback and step counting.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): a rank compresses
``x = gradient + residual``, sends ``C(x)`` and keeps ``residual = x - C(x)`` for the next step,
so nothing the compressor drops is lost, only delayed. Residuals are per DDP bucket. DDP
rebuilds its buckets after the first backward pass, so compression starts at ``start_step >= 1``
and a residual whose size no longer matches its bucket starts again from zero.

Momentum correction (Lin et al. 2018, "Deep Gradient Compression", sec. 3.2): when the optimizer
applies momentum *after* the exchange, an entry held back for many steps arrives at once and is
then amplified by the momentum for many more steps: stale, large updates that cost accuracy. With
``momentum`` set (the strategy takes it from the optimizer, whose own momentum it sets to 0),
each rank keeps its velocity ``u = m u + g`` and compresses ``u + residual`` instead; the
average of the ranks' velocities is exactly SGD's momentum buffer while nothing is dropped, and
an entry that was sent has its velocity cleared (momentum factor masking), so it is not sent
again from momentum alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from trainhub.runtime.distributed.comm_meter import CommMeter

if TYPE_CHECKING:  # torch.distributed re-exports it only when built with distributed support
    from torch._C._distributed_c10d import GradBucket
else:
    GradBucket = dist.GradBucket

__all__ = ["ErrorFeedbackState", "GradBucket", "all_gather_flat", "allreduce_mean"]


class ErrorFeedbackState:
    """Per-process state of a compressing hook: the group, residuals, the step counter.

    Args:
        process_group: group to communicate in; ``None`` is the default (world) group.
        start_step: steps (backward passes) of plain all-reduce before compressing.
        error_feedback: keep residuals; without them the compressor is biased.
        meter: receives payload bytes and the gradients-ready mark.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        start_step: int = 1,
        error_feedback: bool = True,
        meter: CommMeter | None = None,
    ) -> None:
        if start_step < 1:
            raise ValueError(
                "start_step must be >= 1: DDP rebuilds its buckets after the first step"
            )
        self.process_group = process_group
        self.start_step = start_step
        self.error_feedback = error_feedback
        self.meter = meter if meter is not None else CommMeter()
        self.step = 0  # completed backward passes
        self.residuals: dict[int, torch.Tensor] = {}
        self.momentum = 0.0  # > 0: momentum correction (set by the strategy's wrap_optimizer)
        self.velocities: dict[int, torch.Tensor] = {}  # id(parameter) -> its velocity, flat

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    @property
    def compressing(self) -> bool:
        return self.step >= self.start_step

    def on_bucket(self, bucket: GradBucket) -> None:
        """Bookkeeping every hook call does first; the step ends with the last bucket."""
        if bucket.is_last():
            self.meter.mark_gradients_ready()

    def end_bucket(self, bucket: GradBucket) -> None:
        if bucket.is_last():
            self.step += 1

    def with_residual(self, bucket: GradBucket) -> torch.Tensor:
        """``gradient + residual`` of this bucket as a new float32 tensor (with momentum
        correction: ``velocity + residual``)."""
        grad = bucket.buffer().to(torch.float32, copy=True)
        if self.momentum > 0.0:
            grad = self._update_velocities(bucket, grad)
        if not self.error_feedback:
            return grad
        residual = self.residuals.get(bucket.index())
        if residual is not None and residual.shape == grad.shape:
            grad.add_(residual)
        return grad

    def keep_residual(self, bucket: GradBucket, residual: torch.Tensor) -> None:
        if self.error_feedback:
            self.residuals[bucket.index()] = residual

    def _update_velocities(self, bucket: GradBucket, grad: torch.Tensor) -> torch.Tensor:
        """``u = m u + g`` per parameter; the bucket's velocities, flat, as a new tensor.

        Kept per parameter, not per bucket: DDP reorders a bucket's parameters when it rebuilds
        its buckets after the first step, and a flat velocity would then be added to the wrong
        entries.
        """
        parts = []
        offset = 0
        for param in bucket.parameters():
            n = param.numel()
            g = grad[offset : offset + n]
            offset += n
            velocity = self.velocities.get(id(param))
            if velocity is None:
                velocity = g.clone()
                self.velocities[id(param)] = velocity
            else:
                velocity.mul_(self.momentum).add_(g)
            parts.append(velocity)
        return torch.cat(parts)

    def mask_velocity(self, bucket: GradBucket, sent: torch.Tensor) -> None:
        """Momentum factor masking: clear the velocity of the entries just sent (indices)."""
        params = bucket.parameters()
        if not params or id(params[0]) not in self.velocities:
            return
        flat = torch.cat([self.velocities[id(p)] for p in params]).index_fill_(0, sent, 0.0)
        offset = 0
        for param in params:
            n = param.numel()
            self.velocities[id(param)].copy_(flat[offset : offset + n])
            offset += n


def allreduce_mean(
    state: ErrorFeedbackState, bucket: GradBucket, tensor: torch.Tensor | None = None
) -> torch.futures.Future[torch.Tensor]:
    """Average ``tensor`` (default: the bucket's buffer) over the group into the buffer."""
    buffer = bucket.buffer()
    source = buffer if tensor is None else tensor
    world_size = state.world_size
    state.meter.add_allreduce(source.numel() * source.element_size(), world_size)
    work = dist.all_reduce(source, group=state.process_group, async_op=True)
    assert work is not None

    def finish(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        fut.wait()
        buffer.copy_(source.div_(world_size))
        return buffer

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(finish)
    return future


def all_gather_flat(
    output: torch.Tensor, message: torch.Tensor, group: dist.ProcessGroup | None
) -> dist.Work:
    """Asynchronously gather every rank's equal-size ``message`` into ``output``, rank order.

    ``all_gather_single`` (newer torch) replaces the deprecated ``all_gather_into_tensor``.
    """
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work: dist.Work | None = gather(output, message, group=group, async_op=True)
    assert work is not None
    return work
