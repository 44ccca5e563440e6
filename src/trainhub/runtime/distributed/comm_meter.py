"""Counts what a rank communicates, and how long it waits for it.

Every strategy in this package reports to one :class:`CommMeter`: the bytes it hands to
collectives (``payload``), an estimate of the bytes this rank puts on the wire with the ring
algorithms gloo and NCCL use (``wire``), and the time the training loop stood still waiting for
communication. :class:`~trainhub.runtime.distributed.timing.StepTimer` reads it once per step.

How waiting is measured: DDP launches the hook of bucket *i* only after bucket *i-1*, so when the
hook of the last bucket runs, backward's computation is done; the rest of ``loss.backward()`` is
the wait for the collectives still in flight (plus the compression work of the last bucket).
Hooks call :meth:`CommMeter.mark_gradients_ready`; the timer subtracts. Communication outside
backward (model averaging, parameter-server push/pull) is timed directly with
:meth:`CommMeter.sync`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def ring_allreduce_wire_bytes(payload_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce (reduce-scatter + all-gather)."""
    if world_size <= 1:
        return 0
    return 2 * (world_size - 1) * payload_bytes // world_size


def ring_allgather_wire_bytes(payload_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-gather of ``payload_bytes`` per rank."""
    return max(world_size - 1, 0) * payload_bytes


@dataclass(frozen=True)
class CommSnapshot:
    """Totals since the meter was created."""

    payload_bytes: int
    wire_bytes: int
    sync_s: float
    num_collectives: int


class CommMeter:
    """Thread-safe counters; collectives may complete on a backend thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._payload = 0
        self._wire = 0
        self._sync_s = 0.0
        self._count = 0
        self._ready_at: float | None = None

    def add_allreduce(self, payload_bytes: int, world_size: int) -> None:
        self._add(payload_bytes, ring_allreduce_wire_bytes(payload_bytes, world_size))

    def add_allgather(self, payload_bytes: int, world_size: int) -> None:
        self._add(payload_bytes, ring_allgather_wire_bytes(payload_bytes, world_size))

    def add_point_to_point(self, payload_bytes: int) -> None:
        """Bytes sent to another process directly (parameter-server push)."""
        self._add(payload_bytes, payload_bytes)

    def _add(self, payload: int, wire: int) -> None:
        with self._lock:
            self._payload += payload
            self._wire += wire
            self._count += 1

    def mark_gradients_ready(self) -> None:
        """Called by a DDP comm hook for the last bucket of a backward pass."""
        self._ready_at = time.perf_counter()

    def take_backward_wait(self, backward_end: float) -> float:
        """Seconds from the last bucket's hook to the end of backward; 0 if no hook ran."""
        ready, self._ready_at = self._ready_at, None
        return max(backward_end - ready, 0.0) if ready is not None else 0.0

    def add_sync_s(self, seconds: float) -> None:
        with self._lock:
            self._sync_s += seconds

    @contextmanager
    def sync(self) -> Iterator[None]:
        """Time a blocking communication (counted as synchronisation by the step timer)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_sync_s(time.perf_counter() - start)

    def snapshot(self) -> CommSnapshot:
        with self._lock:
            return CommSnapshot(self._payload, self._wire, self._sync_s, self._count)
