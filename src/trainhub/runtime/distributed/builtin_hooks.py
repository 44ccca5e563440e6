"""PyTorch's own DDP comm hooks (all-reduce, fp16/bf16, PowerSGD, post-local SGD), metered.

We do not reimplement what ``torch.distributed.algorithms.ddp_comm_hooks`` ships. Each hook runs
unchanged inside :func:`metered_hook`, which adds the bytes the wrapped hook hands to collectives
(computed from the bucket and the hook's state, by the same rules the hook follows) and marks
when the last bucket's gradients are ready.

PowerSGD on gloo: ``powerSGD_hook`` issues its second and third all-reduce from completion
callbacks of the first. With several buckets in flight those callbacks run on gloo's worker
threads in whatever order the buckets finish, so two ranks can issue their collectives in
different orders and wait on each other forever (seen on two hosts with a 10M-parameter MLP).
On gloo we therefore finish each bucket's PowerSGD before returning from the hook
(``serialize=True``): collectives go out in the same order on every rank, at the cost of no
overlap between PowerSGD's communication and the rest of backward. NCCL keeps the asynchronous
hook.

bf16 on gloo: DDP refuses a hook *named* ``bf16_compress_hook`` unless CUDA with NCCL >= 2.10
is present, because old NCCL lacked bfloat16. Gloo in the torch this project pins sums bfloat16
(and float16) correctly (``tests/distributed/test_hooks.py`` checks it), and the check looks at
the function's name only, so the metered wrapper runs the very same hook on both backends.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# no `from __future__ import annotations`: DDP checks a hook's annotations against real types
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.error_feedback import GradBucket

BytesRule = Callable[[Any, GradBucket], int]
Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


@dataclass
class MeteredState:
    """Wraps a PyTorch hook and its state; ``bytes_rule`` says what one bucket sends."""

    hook: Hook
    state: Any
    bytes_rule: BytesRule
    meter: CommMeter
    world_size: int
    serialize: bool = False  # wait for the bucket's result before returning (see above)


def metered_hook(state: MeteredState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Run the wrapped hook; count its all-reduce payload; mark the end of backward compute.

    A serialized hook's wait is communication time spent inside backward: it is reported as
    synchronisation directly, and the last bucket's mark comes after it.
    """
    payload = state.bytes_rule(state.state, bucket)
    if payload:
        state.meter.add_allreduce(payload, state.world_size)
    if not state.serialize:
        if bucket.is_last():
            state.meter.mark_gradients_ready()
        future: torch.futures.Future[torch.Tensor] = state.hook(state.state, bucket)
        return future
    with state.meter.sync():
        future = state.hook(state.state, bucket)
        future.wait()
    if bucket.is_last():
        state.meter.mark_gradients_ready()
    return future


def _full_fp32(_: Any, bucket: GradBucket) -> int:
    buffer = bucket.buffer()
    return int(buffer.numel() * buffer.element_size())


def _half(_: Any, bucket: GradBucket) -> int:
    return int(bucket.buffer().numel()) * 2


def _powersgd_bytes(state: powerSGD_hook.PowerSGDState, bucket: GradBucket) -> int:
    """What powerSGD_hook all-reduces: vector and small tensors raw, P and Q for the rest."""
    if state.iter < state.start_powerSGD_iter:
        return _full_fp32(state, bucket)
    element = bucket.buffer().element_size()
    rank = state.matrix_approximation_rank
    total = 0
    for grad in bucket.gradients():
        if grad.ndimension() <= 1:
            total += grad.numel() * element
            continue
        rows = grad.shape[0]
        cols = grad.numel() // rows
        low_rank = min(rows, cols, rank)
        compressed = (rows + cols) * low_rank
        if state.min_compression_rate * compressed < rows * cols:  # _should_compress
            total += compressed * element
        else:
            total += rows * cols * element
    return total


def _post_local_bytes(state: PostLocalSGDState, bucket: GradBucket) -> int:
    if state.iter < state.start_localSGD_iter:
        return _full_fp32(state, bucket)
    return 0  # post_local_gradient_allreduce=False: purely local steps


def allreduce_state(meter: CommMeter, group: dist.ProcessGroup | None) -> MeteredState:
    world_size = dist.get_world_size(group)
    return MeteredState(default_hooks.allreduce_hook, group, _full_fp32, meter, world_size)


def fp16_state(meter: CommMeter, group: dist.ProcessGroup | None) -> MeteredState:
    world_size = dist.get_world_size(group)
    return MeteredState(default_hooks.fp16_compress_hook, group, _half, meter, world_size)


def bf16_state(meter: CommMeter, group: dist.ProcessGroup | None) -> MeteredState:
    world_size = dist.get_world_size(group)
    return MeteredState(default_hooks.bf16_compress_hook, group, _half, meter, world_size)


def powersgd_state(
    meter: CommMeter,
    group: dist.ProcessGroup | None,
    *,
    rank: int,
    start_step: int,
    min_compression_rate: float,
    error_feedback: bool,
    warm_start: bool,
) -> MeteredState:
    inner = powerSGD_hook.PowerSGDState(
        process_group=group,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=start_step,
        min_compression_rate=min_compression_rate,
        use_error_feedback=error_feedback,
        warm_start=warm_start,
    )
    world_size = dist.get_world_size(group)
    serialize = dist.get_backend(group) == "gloo"
    return MeteredState(
        powerSGD_hook.powerSGD_hook, inner, _powersgd_bytes, meter, world_size, serialize
    )


def post_local_state(
    meter: CommMeter, group: dist.ProcessGroup | None, *, start_step: int
) -> MeteredState:
    """Global gradient all-reduce until ``start_step``, then no gradient communication at all
    (each rank is its own local-SGD group); the model averager keeps replicas together."""
    inner = PostLocalSGDState(  # type: ignore[no-untyped-call]
        process_group=group,
        subgroup=None,
        start_localSGD_iter=start_step,
        post_local_gradient_allreduce=False,
    )
    world_size = dist.get_world_size(group)
    return MeteredState(post_localSGD_hook, inner, _post_local_bytes, meter, world_size)
