"""Local SGD whose model averaging runs in the background, behind the next local steps.

Periodic averaging (:class:`~trainhub.runtime.distributed.localsgd.MeteredPeriodicAverager`)
stops every rank at each averaging until the slowest rank arrives and the whole model has crossed
the network. On a slow link or with uneven ranks that wait is most of what local SGD still
spends on synchronisation. Overlap local SGD (Wang et al., "Overlap Local-SGD", ICASSP 2020)
hides it: at an averaging step each rank takes a snapshot ``s_i`` of its parameters and starts an
asynchronous all-reduce of it, then keeps training. At the next averaging step it waits for that
all-reduce (long done, on a link that carries the model within one period) and applies the
correction ``x_i += mean(s) - s_i``: the replicas agree on the average of the snapshots and keep
the local progress each made since. Replicas therefore differ by at most one period of local
steps, as with periodic averaging, but averaging happens one period late.

PyTorch ships only the blocking averagers (``torch.distributed.algorithms.model_averaging``); this
class has the same interface (``average_parameters(params)`` with a ``step`` counter), so
``PostLocalSGDOptimizer`` drives it and checkpoints its step like theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.localsgd import check_period, is_averaging_step


class _Bucket:
    """Parameters of one dtype and device with two flat buffers kept for the whole training:
    the snapshot ``s_i`` and the sum being all-reduced (fresh 100 MB buffers at every
    averaging would cost page faults comparable to the work itself)."""

    __slots__ = ("params", "snapshot", "snapshot_views", "total", "total_views", "work")

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        numel = sum(p.numel() for p in params)
        first = params[0]
        self.snapshot = torch.empty(numel, dtype=first.dtype, device=first.device)
        self.total = torch.empty_like(self.snapshot)
        self.snapshot_views = _views(self.snapshot, params)
        self.total_views = _views(self.total, params)
        self.work: dist.Work | None = None

    @property
    def payload_bytes(self) -> int:
        return self.snapshot.numel() * self.snapshot.element_size()

    def start(self, group: dist.ProcessGroup) -> None:
        """Snapshot the parameters and start summing the snapshots of all ranks."""
        with torch.no_grad():
            torch._foreach_copy_(self.snapshot_views, [p.detach() for p in self.params])
            self.total.copy_(self.snapshot)
        self.work = dist.all_reduce(self.total, group=group, async_op=True)

    def apply(self, world_size: int) -> None:
        """Wait for the sum and move every parameter by ``mean(snapshots) - own snapshot``."""
        assert self.work is not None
        self.work.wait()
        self.work = None
        with torch.no_grad():
            # (sum - W s_i) / W, in two passes over the buffers
            self.total.sub_(self.snapshot, alpha=world_size)
            torch._foreach_add_(
                [p.detach() for p in self.params], self.total_views, alpha=1.0 / world_size
            )


def _views(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


class OverlappedAverager(ModelAverager):
    """Average every ``period`` steps after ``warmup_steps``, one period late, without waiting.

    Args:
        period: optimizer steps between two averagings (>= 2).
        warmup_steps: no averaging before this step; equal to the hook's ``start_step``.
        meter: receives the all-reduce payload and the time spent waiting and correcting.
        process_group: group to average over; ``None`` is the world. For the world, the
            averaging gets a communicator of its own (created here, so every rank must construct
            the averager), so that DDP's collectives never queue behind it.

    Call :meth:`flush` on every rank before using the model as the trial's result (evaluation,
    the last checkpoint): it applies the averaging still in flight.
    """

    def __init__(
        self,
        period: int,
        warmup_steps: int,
        meter: CommMeter,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        check_period(period)
        super().__init__(process_group=process_group)
        self.period = period
        self.warmup_steps = warmup_steps
        self.meter = meter
        self.world_size = dist.get_world_size(self.process_group)
        self.comm_group = self.process_group
        if process_group is None or process_group is dist.group.WORLD:
            self.comm_group = dist.new_group(list(range(self.world_size)))
        self._in_flight: list[_Bucket] = []
        # buckets by the identity of their parameters, reused from one averaging to the next
        self._buckets: dict[tuple[int, ...], _Bucket] = {}

    def will_average(self) -> bool:
        return is_averaging_step(int(self.step), self.warmup_steps, self.period)

    @property
    def in_flight(self) -> bool:
        return bool(self._in_flight)

    def average_parameters(
        self, params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]]
    ) -> None:
        if self.will_average():
            tensors = get_params_to_average(params)
            with self.meter.sync():
                self._apply_in_flight()
                self._start(tensors)
        self.step += 1

    def flush(self) -> None:
        """Apply the averaging in flight, if any (waits for it)."""
        with self.meter.sync():
            self._apply_in_flight()

    def _start(self, tensors: list[torch.Tensor]) -> None:
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        for params in groups.values():
            key = tuple(id(p) for p in params)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(params)
            bucket.start(self.comm_group)
            self.meter.add_allreduce(bucket.payload_bytes, self.world_size)
            self._in_flight.append(bucket)

    def _apply_in_flight(self) -> None:
        buckets, self._in_flight = self._in_flight, []
        for bucket in buckets:
            bucket.apply(self.world_size)
