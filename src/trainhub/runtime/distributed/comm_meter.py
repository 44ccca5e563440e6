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

import atexit
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainhub.runtime.protocol import COMM_COUNTS_FILE, ENV_SPOOL_DIR

PUBLISH_INTERVAL_S = 1.0


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
    """Thread-safe counters; collectives may complete on a backend thread.

    Under the control plane (``TRAINHUB_SPOOL_DIR`` set) the counts are also published to the
    rank's file there at most once a second and at exit: the rank's actor ships them with its
    namespace's kernel counters (network traffic per tenant, docs/adr/0045). Several meters in
    one process publish their sum."""

    def __init__(self, publish_to: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.Lock()
        spool = publish_to if publish_to is not None else os.environ.get(ENV_SPOOL_DIR)
        self._published_at = 0.0
        self._target: Path | None = None
        if spool:
            rank = int(os.environ.get("RANK", "0"))
            self._target = Path(spool) / COMM_COUNTS_FILE.format(rank=rank)
            _METERS.append(self)
            if len(_METERS) == 1:
                atexit.register(_publish_all)
        self._payload = 0
        self._wire = 0
        self._sync_s = 0.0
        self._count = 0
        self._ready_at: float | None = None

    def add_allreduce(self, payload_bytes: int, world_size: int) -> None:
        self._add(payload_bytes, ring_allreduce_wire_bytes(payload_bytes, world_size))

    def add_allgather(self, payload_bytes: int, world_size: int) -> None:
        self._add(payload_bytes, ring_allgather_wire_bytes(payload_bytes, world_size))

    def add_broadcast(self, payload_bytes: int, world_size: int, rank: int) -> None:
        """A broadcast of ``payload_bytes``, as a chain in rank order: every rank but the last
        passes it on (the ring model traffic attribution reads hook counts by)."""
        if world_size > 1:
            self._add(payload_bytes, payload_bytes if rank < world_size - 1 else 0)

    def add_point_to_point(self, payload_bytes: int) -> None:
        """Bytes sent to another process directly (parameter-server push)."""
        self._add(payload_bytes, payload_bytes)

    def _add(self, payload: int, wire: int) -> None:
        with self._lock:
            self._payload += payload
            self._wire += wire
            self._count += 1
        if self._target is not None and time.monotonic() - self._published_at >= PUBLISH_INTERVAL_S:
            self._published_at = time.monotonic()
            _publish_all()

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

    def publish(self) -> None:
        """Write the counts now (the meter's process may end without running ``atexit``)."""
        if self._target is not None:
            _publish_all()

    def snapshot(self) -> CommSnapshot:
        with self._lock:
            return CommSnapshot(self._payload, self._wire, self._sync_s, self._count)


_METERS: list[CommMeter] = []


def _publish_all() -> None:
    """Write the sum of this process's meters to each target (atomically: a reader never sees
    half a file); a full disk or a vanished spool loses a sample, never the step."""
    totals: dict[Path, list[int]] = {}
    for meter in list(_METERS):
        if meter._target is None:
            continue
        snap = meter.snapshot()
        sums = totals.setdefault(meter._target, [0, 0])
        sums[0] += snap.wire_bytes
        sums[1] += snap.payload_bytes
    for target, (wire, payload) in totals.items():
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            temporary.write_text(json.dumps({"wire_bytes": wire, "payload_bytes": payload}))
            os.replace(temporary, target)
