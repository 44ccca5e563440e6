"""1-bit gradient compression with error feedback, as a DDP comm hook.

Each rank sends the sign of every gradient entry as one bit, and one float32 scale per block of
``block_size`` consecutive entries of a tensor, the mean absolute value of that block (the
scaled-sign compressor of Seide et al. 2014 and Bernstein et al. 2018, with block-wise scales
as in the block quantisers of 8-bit optimisers). Error feedback keeps ``x - scale * sign(x)``
for the next step. The signs travel packed eight to a ``uint8``, so a float32 bucket of ``n``
entries costs about ``n / 8 + 4 n / block_size`` bytes instead of ``4 n``: 28x less with the
default 256.

Why blocks: with one scale per tensor (the earlier design, as in 1-bit Adam), every entry of a
7.7M-entry layer is sent as +-(mean |g| of the whole layer), so rows whose gradient is near zero
receive large noise each step and rely on error feedback to cancel it later; on
benchmarks/comm.py's 10M-parameter MLP that cost 6 accuracy points after 2 epochs. Block scales
follow the gradient's magnitude across the tensor (see docs/distributed.md for the numbers).

Summing sign bits is not a reduction any backend offers, so ranks exchange their packed bits and
scales with one flat all-gather (gloo and NCCL both have it for ``uint8``) and every
rank decodes and averages the ``world_size`` compressed gradients itself.
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations against real types
import numpy as np
import torch
import torch.distributed as dist

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.error_feedback import (
    ErrorFeedbackState,
    GradBucket,
    all_gather_flat,
    allreduce_mean,
)

_SHIFTS = (7, 6, 5, 4, 3, 2, 1, 0)  # first entry in the most significant bit (numpy's order)


class OneBitState(ErrorFeedbackState):
    """State of :func:`onebit_hook`.

    Args:
        block_size: entries per scale (each tensor is cut into blocks of this many).
        other arguments: see :class:`ErrorFeedbackState`.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        block_size: int = 256,
        start_step: int = 1,
        error_feedback: bool = True,
        meter: CommMeter | None = None,
    ) -> None:
        super().__init__(
            process_group, start_step=start_step, error_feedback=error_feedback, meter=meter
        )
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1; got {block_size}")
        self.block_size = block_size


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per entry of a 1-D tensor, 1 where ``x >= 0``, packed into ``uint8``
    (first entry in the most significant bit; zero padding at the end)."""
    return _pack(x >= 0)


def _pack(positive: torch.Tensor) -> torch.Tensor:
    if positive.device.type == "cpu":  # numpy's packbits is several times faster on CPU
        return _pack_numpy(positive)
    return _pack_torch(positive)


def _pack_numpy(positive: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.packbits(positive.numpy()))


def _pack_torch(positive: torch.Tensor) -> torch.Tensor:
    bits = positive.to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    bits = bits.view(-1, 8)
    packed = bits[:, 0] << _SHIFTS[0]
    for column, shift in enumerate(_SHIFTS[1:], start=1):
        packed |= bits[:, column] << shift
    return packed


def unpack_signs(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_signs`: a bool tensor of ``numel`` entries, True for ``x >= 0``."""
    if packed.device.type == "cpu":
        return _unpack_numpy(packed, numel)
    return _unpack_torch(packed, numel)


def _unpack_numpy(packed: torch.Tensor, numel: int) -> torch.Tensor:
    return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel).view(np.bool_))


def _unpack_torch(packed: torch.Tensor, numel: int) -> torch.Tensor:
    shifts = torch.tensor(_SHIFTS, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(1) >> shifts) & 1).view(-1)[:numel].bool()


def split_blocks(lengths: list[int], block_size: int) -> list[int]:
    """Each tensor's length cut into blocks of ``block_size`` entries (its last one shorter)."""
    blocks: list[int] = []
    for length in lengths:
        full, rest = divmod(length, block_size)
        blocks.extend([block_size] * full)
        if rest:
            blocks.append(rest)
    return blocks


def _blocks(lengths: list[int], block_size: int | None) -> list[tuple[int, int, int]]:
    """``(offset, full blocks, rest)`` of each tensor; without ``block_size`` one block each."""
    out, offset = [], 0
    for length in lengths:
        size = block_size or max(length, 1)
        full, rest = divmod(length, size)
        out.append((offset, full, rest))
        offset += length
    return out


def segment_scales(
    x: torch.Tensor, lengths: list[int], block_size: int | None = None
) -> torch.Tensor:
    """Mean absolute value of each block of each tensor (each tensor one block by default)."""
    magnitude = x.abs()
    scales: list[torch.Tensor] = []
    for (offset, full, rest), length in zip(_blocks(lengths, block_size), lengths, strict=True):
        size = block_size or max(length, 1)
        if full:
            scales.append(magnitude[offset : offset + full * size].view(full, size).mean(1))
        if rest:
            scales.append(magnitude[offset + full * size : offset + length].mean().reshape(1))
    return torch.cat(scales).to(torch.float32)


def _add_scaled_signs(
    out: torch.Tensor,
    positive: torch.Tensor,
    scales: torch.Tensor,
    lengths: list[int],
    block_size: int | None = None,
) -> None:
    """``out += scale * (2 * positive - 1)`` block by block, in place (a reshape per tensor)."""
    scales = scales.to(out.dtype)
    signs = positive.to(out.dtype).mul_(2.0).sub_(1.0)
    used = 0
    for (offset, full, rest), length in zip(_blocks(lengths, block_size), lengths, strict=True):
        size = block_size or max(length, 1)
        if full:
            end = offset + full * size
            block_scales = scales[used : used + full].unsqueeze(1)
            out[offset:end].view(full, size).addcmul_(
                signs[offset:end].view(full, size), block_scales
            )
            used += full
        if rest:
            start = offset + full * size
            out[start : offset + length].add_(
                signs[start : offset + length], alpha=float(scales[used])
            )
            used += 1


def compress(
    x: torch.Tensor, lengths: list[int], block_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The wire message of ``x`` (float32 scales as bytes, then the packed signs) and the
    residual ``x - scale * sign(x)`` this rank keeps. ``lengths``: the tensors of the bucket;
    ``block_size``: entries per scale (default: one scale per tensor)."""
    scales = segment_scales(x, lengths, block_size)
    positive = x >= 0
    message = torch.cat([scales.view(torch.uint8), _pack(positive).to(x.device)])
    residual = x.clone()
    _add_scaled_signs(residual, positive, -scales, lengths, block_size)
    return message, residual


def num_scales(lengths: list[int], block_size: int | None = None) -> int:
    return sum(full + (1 if rest else 0) for _, full, rest in _blocks(lengths, block_size))


def decompress_into(
    total: torch.Tensor, message: torch.Tensor, lengths: list[int], block_size: int | None = None
) -> torch.Tensor:
    """Add the scaled signs one message stands for to ``total`` (float32, in place)."""
    count = num_scales(lengths, block_size)
    # clone: a slice of the gathered buffer may not be 4-byte aligned for a float32 view
    scales = message[: 4 * count].clone().view(torch.float32)
    positive = unpack_signs(message[4 * count :], sum(lengths))
    _add_scaled_signs(total, positive, scales, lengths, block_size)
    return total


def decompress(
    message: torch.Tensor, lengths: list[int], block_size: int | None = None
) -> torch.Tensor:
    total = torch.zeros(sum(lengths), dtype=torch.float32, device=message.device)
    return decompress_into(total, message, lengths, block_size)


def onebit_hook(state: OneBitState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average of the ranks' scaled-sign gradients, with error feedback.

    Register on every rank: ``ddp.register_comm_hook(OneBitState(start_step=10), onebit_hook)``.
    Before ``start_step`` it is a plain averaging all-reduce.
    """
    state.on_bucket(bucket)
    if not state.compressing:
        # with momentum correction the velocity travels from the first step on
        x = state.with_residual(bucket) if state.momentum > 0.0 else None
        fut = allreduce_mean(state, bucket, x)
        state.end_bucket(bucket)
        return fut
    buffer = bucket.buffer()
    lengths = [g.numel() for g in bucket.gradients()]
    block = state.block_size
    x = state.with_residual(bucket)
    message, residual = compress(x, lengths, block)
    state.keep_residual(bucket, residual)
    world_size = state.world_size
    gathered = message.new_empty(world_size * message.numel())
    state.meter.add_allgather(message.numel(), world_size)
    work = all_gather_flat(gathered, message, state.process_group)
    state.end_bucket(bucket)

    def finish(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        fut.wait()
        total = torch.zeros(buffer.numel(), dtype=torch.float32, device=buffer.device)
        for part in gathered.view(world_size, -1):
            decompress_into(total, part, lengths, block)
        buffer.copy_(total.div_(world_size))
        return buffer

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(finish)
    return future
