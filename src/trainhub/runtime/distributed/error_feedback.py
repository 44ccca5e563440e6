"""What the compressing DDP comm hooks of this package share: error feedback and step counting.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): a rank compresses
``x = gradient + residual``, sends ``C(x)`` and keeps ``residual = x - C(x)`` for the next step,
so nothing the compressor drops is lost, only delayed. Residuals are per DDP bucket. DDP
rebuilds its buckets after the first backward pass, so compression starts at ``start_step >= 1``
and a residual whose size no longer matches its bucket starts again from zero.
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
        """``gradient + residual`` of this bucket as a new float32 tensor."""
        grad = bucket.buffer().to(torch.float32, copy=True)
        if not self.error_feedback:
            return grad
        residual = self.residuals.get(bucket.index())
        if residual is not None and residual.shape == grad.shape:
            grad.add_(residual)
        return grad

    def keep_residual(self, bucket: GradBucket, residual: torch.Tensor) -> None:
        if self.error_feedback:
            self.residuals[bucket.index()] = residual


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
