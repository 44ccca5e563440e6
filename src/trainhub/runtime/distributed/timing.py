"""Where the time of a training step goes: data, forward, backward, sync, optimizer.

:class:`StepTimer` times the phases a training loop marks, takes the time spent waiting for
communication out of the phase it happened in (see :mod:`.comm_meter` for how), and summarises
a window of steps as a flat dict of floats that ``ctx.report`` can ship::

    {"time/step_s": 0.21, "time/data_share": 0.02, "time/forward_share": 0.18,
     "time/backward_share": 0.35, "time/sync_share": 0.40, "time/optimizer_share": 0.04,
     "time/other_share": 0.01, "comm/bytes_per_step": 2.1e6, "comm/payload_bytes_per_step": 2.1e6,
     "throughput/samples_per_s": 610.0, "throughput/steps_per_s": 4.76, "time/num_steps": 50}

On CUDA, kernels run asynchronously, so the timer synchronises the device at each phase boundary
(``synchronize=True``, the default) to charge their time to the right phase; this costs a little
overlap between phases.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import torch

from trainhub.runtime.distributed.comm_meter import CommMeter

if TYPE_CHECKING:
    from trainhub.runtime.distributed.parallel import ParallelModel

PHASES = ("data", "forward", "backward", "optimizer")
PARALLEL_PHASES = ("bubble", "tp_comm")  # with a ParallelModel
_T = TypeVar("_T")


class StepTimer:
    """Per-step phase timer with per-window summaries.

    Args:
        meter: the :class:`CommMeter` of the prepared model (bytes and waits); optional.
        device: synchronised at phase boundaries when it is a CUDA device.
        report_every_steps: :meth:`should_report` turns true every this many steps; ``None``
            leaves the window to the caller (e.g. once per epoch).
        synchronize: synchronise CUDA at phase boundaries.
        parallel: the model of ``ctx.parallelize``: the pipeline bubble (this rank idle or
            waiting for another stage) and the tensor-parallel communication inside a phase
            become their own shares, ``time/bubble_share`` and ``time/tp_comm_share``.

    Example (every rank; rank 0 reports):
        >>> timer = StepTimer(meter=prepared.meter, device=device, report_every_steps=50)
        >>> for x, y in timer.iter_data(loader):
        ...     with timer.phase("forward"):
        ...         loss = loss_fn(model(x), y)
        ...     with timer.phase("backward"):
        ...         loss.backward()
        ...     with timer.phase("optimizer"):
        ...         optimizer.step(); optimizer.zero_grad()
        ...     timer.end_step(num_samples=len(x))
        ...     if timer.should_report():
        ...         ctx.report(step=step, **timer.summary())
    """

    def __init__(
        self,
        *,
        meter: CommMeter | None = None,
        device: torch.device | str | None = None,
        report_every_steps: int | None = None,
        synchronize: bool = True,
        parallel: ParallelModel | None = None,
    ) -> None:
        if report_every_steps is not None and report_every_steps < 1:
            raise ValueError("report_every_steps must be >= 1")
        self.meter = meter
        self.device = torch.device(device) if device is not None else None
        self.report_every_steps = report_every_steps
        self.parallel = parallel
        self._cuda_sync = synchronize and self.device is not None and self.device.type == "cuda"
        self._step_start: float | None = None
        self._bytes_at_start = (0, 0)
        self._reset_window()

    def _reset_window(self) -> None:
        self._totals = dict.fromkeys((*PHASES, "sync", "step", *PARALLEL_PHASES), 0.0)
        self._payload = 0
        self._wire = 0
        self._samples = 0
        self._steps = 0

    def _now(self) -> float:
        if self._cuda_sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _begin_step_if_needed(self) -> None:
        if self._step_start is None:
            self._step_start = self._now()
            snap = self.meter.snapshot() if self.meter is not None else None
            self._bytes_at_start = (snap.payload_bytes, snap.wire_bytes) if snap else (0, 0)

    def _sync_s(self) -> float:
        return self.meter.snapshot().sync_s if self.meter is not None else 0.0

    def _parallel_s(self) -> tuple[float, float]:
        if self.parallel is None:
            return 0.0, 0.0
        times = self.parallel.times
        return times.bubble_s, times.tp_comm_s

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase (``data``, ``forward``, ``backward`` or ``optimizer``) of this step."""
        if name not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}; got {name!r}")
        self._begin_step_if_needed()
        start = self._now()
        sync_before = self._sync_s()
        bubble_before, tp_before = self._parallel_s()
        try:
            yield
        finally:
            end = self._now()
            waited = self._sync_s() - sync_before
            if name == "backward" and self.meter is not None:
                waited += self.meter.take_backward_wait(end)
            elapsed = end - start
            waited = min(waited, elapsed)
            bubble_after, tp_after = self._parallel_s()
            bubble = min(max(0.0, bubble_after - bubble_before), elapsed - waited)
            tp_comm = min(max(0.0, tp_after - tp_before), elapsed - waited - bubble)
            self._totals[name] += elapsed - waited - bubble - tp_comm
            self._totals["sync"] += waited
            self._totals["bubble"] += bubble
            self._totals["tp_comm"] += tp_comm

    def iter_data(self, loader: Iterable[_T]) -> Iterator[_T]:
        """Iterate ``loader``, charging the time to fetch each batch to ``data``."""
        iterator = iter(loader)
        while True:
            with self.phase("data"):
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
            yield batch

    def end_step(self, num_samples: int) -> None:
        """Close the step (all ranks call it after the optimizer step)."""
        self._begin_step_if_needed()
        assert self._step_start is not None
        end = self._now()
        self._totals["step"] += end - self._step_start
        self._step_start = None
        if self.meter is not None:
            snap = self.meter.snapshot()
            self._payload += snap.payload_bytes - self._bytes_at_start[0]
            self._wire += snap.wire_bytes - self._bytes_at_start[1]
        self._samples += num_samples
        self._steps += 1

    def should_report(self) -> bool:
        return (
            self.report_every_steps is not None
            and self._steps > 0
            and self._steps % self.report_every_steps == 0
        )

    @property
    def num_steps(self) -> int:
        return self._steps

    def summary(self, *, reset: bool = True) -> dict[str, float]:
        """Metrics of the steps since the last reset; empty when no step ended."""
        if self._steps == 0:
            return {}
        step_total = self._totals["step"]
        names = (*PHASES, "sync", *(PARALLEL_PHASES if self.parallel is not None else ()))
        share = {
            name: (self._totals[name] / step_total if step_total > 0 else 0.0) for name in names
        }
        metrics = {f"time/{name}_share": value for name, value in share.items()}
        metrics["time/other_share"] = max(0.0, 1.0 - sum(share.values()))
        metrics["time/step_s"] = step_total / self._steps
        metrics["time/num_steps"] = float(self._steps)
        metrics["comm/bytes_per_step"] = self._wire / self._steps
        metrics["comm/payload_bytes_per_step"] = self._payload / self._steps
        metrics["throughput/samples_per_s"] = self._samples / step_total if step_total else 0.0
        metrics["throughput/steps_per_s"] = self._steps / step_total if step_total else 0.0
        if reset:
            self._reset_window()
        return metrics
