"""Top-k gradient sparsification with error feedback and a density warm-up, as a DDP comm hook.

Each rank sends the ``k = ceil(density * n)`` entries of largest magnitude of ``gradient +
residual`` in a bucket of ``n`` entries, as int32 indices and float32 values, and keeps the rest
as its residual (Stich et al. 2018; Lin et al. 2018, "Deep Gradient Compression"). Early in
training gradients change fast, so the density starts at 1 and falls geometrically to its target
over ``warmup_steps`` (the exponential warm-up of DGC).

Different ranks pick different indices, so a sum all-reduce cannot add them: ranks exchange
``(indices, values)`` with one flat all-gather (a fixed ``2k`` int32 words per rank)
and each scatter-adds the ``world_size`` sparse gradients itself. While ``2k >= n`` the sparse
message would be larger than the dense one, so the hook all-reduces the dense ``gradient +
residual`` and clears the residual.
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations against real types
import math

import torch
import torch.distributed as dist

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.error_feedback import (
    ErrorFeedbackState,
    GradBucket,
    all_gather_flat,
    allreduce_mean,
)

_SAMPLING_MIN_NUMEL = 100_000
_SAMPLE_MIN = 10_000


class TopKState(ErrorFeedbackState):
    """State of :func:`topk_hook`.

    Args:
        density: fraction of each bucket's entries sent once warmed up, in (0, 1].
        warmup_steps: steps over which the density falls from 1 to ``density``.
        other arguments: see :class:`ErrorFeedbackState`.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        density: float = 0.01,
        warmup_steps: int = 100,
        start_step: int = 1,
        error_feedback: bool = True,
        meter: CommMeter | None = None,
    ) -> None:
        super().__init__(
            process_group, start_step=start_step, error_feedback=error_feedback, meter=meter
        )
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1]; got {density}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0; got {warmup_steps}")
        self.density = density
        self.warmup_steps = warmup_steps
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """A private generator for threshold sampling (the user's RNG stays untouched)."""
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(0)
        return self._generators[device]

    def current_density(self) -> float:
        """1 before ``start_step``, then geometric decay to ``density`` over the warm-up."""
        since = self.step - self.start_step
        if since < 0:
            return 1.0
        if self.warmup_steps == 0 or since >= self.warmup_steps:
            return self.density
        return float(self.density ** (since / self.warmup_steps))


def num_selected(numel: int, density: float) -> int:
    return min(numel, max(1, math.ceil(density * numel)))


def select_topk(
    x: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (int32) and values of the ``k`` entries of ``x`` with the largest magnitude.

    ``torch.topk`` over millions of entries is slow on CPU, so for large ``x`` a random sample
    first gives a threshold expected to pass about ``2k`` entries (the sampling of Deep Gradient
    Compression); ``topk`` then runs over those candidates only. While at least ``k`` entries
    pass, every one of the true top ``k`` is among them, so the result is exact; otherwise it
    falls back to ``topk`` over everything.
    """
    numel = x.numel()
    magnitude = x.abs()
    if numel >= _SAMPLING_MIN_NUMEL and 8 * k <= numel:
        sample_size = max(_SAMPLE_MIN, numel // 100)
        sample = torch.randint(numel, (sample_size,), generator=generator, device=x.device)
        rank_in_sample = min(sample_size, math.ceil(2 * k * sample_size / numel) + 1)
        threshold = torch.topk(magnitude[sample], rank_in_sample, sorted=False).values.min()
        candidates = (magnitude >= threshold).nonzero().squeeze(1)
        if candidates.numel() >= k:
            _, chosen = torch.topk(magnitude[candidates], k, sorted=False)
            indices = candidates[chosen]
            return indices.to(torch.int32), x[indices]
    _, indices = torch.topk(magnitude, k, sorted=False)
    return indices.to(torch.int32), x[indices]


def topk_hook(state: TopKState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average of the ranks' top-k sparse gradients, with error feedback.

    Register on every rank: ``ddp.register_comm_hook(TopKState(density=0.01), topk_hook)``.
    """
    state.on_bucket(bucket)
    buffer = bucket.buffer()
    numel = buffer.numel()
    k = num_selected(numel, state.current_density())
    if not state.compressing or 2 * k >= numel:
        # with momentum correction the velocity travels from the first step on (the optimizer
        # has no momentum of its own then)
        with_velocity = state.compressing or state.momentum > 0.0
        x = state.with_residual(bucket) if with_velocity else None
        if x is not None:
            state.keep_residual(bucket, torch.zeros_like(x))
        fut = allreduce_mean(state, bucket, x)
        state.end_bucket(bucket)
        return fut
    x = state.with_residual(bucket)
    indices, values = select_topk(x, k, state.generator(x.device))
    message = torch.cat([indices, values.view(torch.int32)])
    state.keep_residual(bucket, x.index_fill_(0, indices.long(), 0.0))
    state.mask_velocity(bucket, indices.long())
    world_size = state.world_size
    gathered = message.new_empty(world_size * message.numel())
    state.meter.add_allgather(message.numel() * message.element_size(), world_size)
    work = all_gather_flat(gathered, message, state.process_group)
    state.end_bucket(bucket)

    def finish(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        fut.wait()
        total = torch.zeros(numel, dtype=torch.float32, device=buffer.device)
        for part in gathered.view(world_size, 2, k):
            total.index_add_(0, part[0].long(), part[1].view(torch.float32))
        buffer.copy_(total.div_(world_size))
        return buffer

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(finish)
    return future
