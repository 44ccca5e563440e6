"""Where reported metrics go: the control plane (batched, retried) or local files.

:class:`RemoteMetricsSink` keeps every point in memory until the control plane acknowledged it.
A background thread sends a batch when it holds ``metrics_batch_max_points`` points or its oldest
point waited ``metrics_batch_s``; while the control plane is unreachable it retries the same
points (plus newer ones) with back-off, so nothing is dropped and the order is kept. The server
treats a step reported twice as a replace, which makes a retry after an unknown outcome safe.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import numbers
import re
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from trainhub.runtime import protocol
from trainhub.runtime.transport import (
    Backoff,
    ControlPlaneClient,
    ControlPlaneError,
    DeadlineExceeded,
    TransientError,
    Waker,
    retry_transient,
)

logger = logging.getLogger("trainhub.runtime")


_METRIC_NAME = re.compile(protocol.METRIC_NAME_PATTERN)


def coerce_metric(name: str, value: object) -> float:
    """A reported value as a float: Python and NumPy numbers, 1-element tensors and arrays.

    Booleans are refused (the control plane takes numbers only, never coerces); so are names
    the control plane refuses (1-128 letters, digits, '_', '.', '-', '/').
    """
    if not _METRIC_NAME.match(name):
        raise ValueError(
            f"metric name {name[:40]!r} is not allowed: use 1-128 letters, digits, '_', '.', "
            "'-' or '/'"
        )
    if isinstance(value, bool):
        raise TypeError(f"metric {name!r} must be a number, got a bool (use 0 or 1)")
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            scalar = item()
        except (RuntimeError, ValueError):
            shape = tuple(getattr(value, "shape", ()))
            raise TypeError(
                f"metric {name!r} must be a single number; got a tensor/array of shape {shape} "
                "(reduce it first, e.g. loss.mean())"
            ) from None
        if isinstance(scalar, numbers.Real):
            return float(scalar)
    raise TypeError(
        f"metric {name!r} must be a number or a one-element tensor, got {type(value).__name__}"
    )


def _within_body_bound(points: list[protocol.MetricPoint]) -> list[protocol.MetricPoint]:
    """The leading points whose JSON stays under the control plane's body bound (at least
    one: a point of 256 metrics with 128-character names is ~40 KB)."""
    room = protocol.MAX_METRICS_BODY_BYTES - 4096  # the envelope and the progress
    for i, point in enumerate(points):
        room -= len(json.dumps(point, separators=(",", ":"))) + 1
        if room < 0 and i:
            return points[:i]
    return points


def coerce_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    if len(metrics) > protocol.MAX_METRICS_PER_POINT:
        raise ValueError(
            f"{len(metrics)} metrics in one report(); the control plane takes at most "
            f"{protocol.MAX_METRICS_PER_POINT} per step"
        )
    return {name: coerce_metric(name, value) for name, value in metrics.items()}


class BaseMetricsSink(ABC):
    """Receives the points and progress of rank 0."""

    # why the control plane refused a batch for the trial's storage quota, or None
    quota_refusal: str | None = None

    @abstractmethod
    def add(self, point: protocol.MetricPoint) -> None:
        """Take one point; never blocks on I/O to the control plane."""

    @abstractmethod
    def set_progress(self, progress: protocol.Progress) -> None:
        """Remember the latest progress; it travels with the next batch."""

    def begin_close(self, timeout_s: float) -> None:  # noqa: B027 (optional hook)
        """Send what is pending now; keep retrying for at most ``timeout_s``; take no more."""

    def finish_close(self) -> bool:
        """Wait for :meth:`begin_close` to end; True if every point got through."""
        return True

    def close(self, timeout_s: float) -> bool:
        self.begin_close(timeout_s)
        return self.finish_close()

    def flush(self, timeout_s: float) -> bool:
        """Send what is pending now and wait for it; True if all got through in time."""
        return True

    @property
    def reachable(self) -> bool:
        """False while the last try to send failed (the control plane is away)."""
        return True


class NullMetricsSink(BaseMetricsSink):
    """Ranks other than 0: reporting is a no-op."""

    def add(self, point: protocol.MetricPoint) -> None:
        pass

    def set_progress(self, progress: protocol.Progress) -> None:
        pass


class LocalMetricsSink(BaseMetricsSink):
    """Standalone mode: one JSON line per point on stdout and appended to ``path``.

    A line reads ``{"step": 3, "train_loss": 0.12, "val_accuracy": 0.97}``.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def add(self, point: protocol.MetricPoint) -> None:
        line = json.dumps({"step": point["step"], **point["values"]})
        with self._lock:
            print(line, flush=True)
            if self._file is None:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self._path.open("a", encoding="utf-8")
            self._file.write(line + "\n")
            self._file.flush()

    def set_progress(self, progress: protocol.Progress) -> None:
        pass  # the metric lines already show where training is

    def finish_close(self) -> bool:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        return True


class RemoteMetricsSink(BaseMetricsSink):
    """Managed mode: batches points to ``POST /trials/{id}/metrics`` from a background thread.

    Args:
        client_factory: Makes the HTTP client the background thread owns.
        attempt: Sent with every batch.
        batch_s: Longest wait of a point before its batch is sent.
        batch_max_points: Largest batch.
        backoff: Spacing of retries while the control plane is away.
        spill_path: Where points still undelivered when ``close()`` gives up are written
            (JSON lines), so an outage longer than the flush timeout leaves a record.
        on_signals: Receives the signals each reply carries (a stop rides on the reply to a
            report), before the batch counts as delivered: a ``flush()`` that returned True
            has handed them over.
    """

    def __init__(
        self,
        client_factory: Callable[[], ControlPlaneClient],
        *,
        attempt: int,
        batch_s: float,
        batch_max_points: int,
        backoff: Backoff,
        spill_path: Path | None = None,
        on_signals: Callable[[protocol.Signals], None] | None = None,
    ) -> None:
        self._client_factory = client_factory
        self._on_signals = on_signals
        self._attempt = attempt
        self._batch_s = batch_s
        self._batch_max_points = min(batch_max_points, protocol.MAX_POINTS_PER_REQUEST)
        self._backoff = backoff
        self._spill_path = spill_path
        self._cond = threading.Condition()
        # points not yet acknowledged, oldest first; only the sender thread removes from the left
        self._queue: deque[protocol.MetricPoint] = deque()
        self._progress: protocol.Progress | None = None
        self._progress_version = 0
        self._sent_progress_version = 0
        self._pending_since = math.inf
        self._flush_requests = 0
        self._deadline = math.inf
        self._closing = False
        self._num_lost = 0
        self._nonfinite_warned: set[str] = set()
        self._reachable = True
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="trainhub-metrics", daemon=True)
        self._thread.start()

    # --- training thread ---

    def add(self, point: protocol.MetricPoint) -> None:
        values = {k: v for k, v in point["values"].items() if math.isfinite(v)}
        for name in point["values"].keys() - values.keys():
            if name not in self._nonfinite_warned:
                self._nonfinite_warned.add(name)
                logger.warning(
                    "trainhub: metric %r is %s at step %d; non-finite values are not sent to "
                    "the control plane (JSON has no NaN/inf)",
                    name,
                    point["values"][name],
                    point["step"],
                )
        if not values:
            return
        with self._cond:
            if self._closing:
                logger.error(
                    "trainhub: report() after close(); point of step %d dropped", point["step"]
                )
                return
            self._mark_pending()
            self._queue.append({"step": point["step"], "values": values, "time": point["time"]})
            if len(self._queue) >= self._batch_max_points:
                self._cond.notify_all()

    def set_progress(self, progress: protocol.Progress) -> None:
        with self._cond:
            self._mark_pending()
            self._progress = progress
            self._progress_version += 1

    def flush(self, timeout_s: float) -> bool:
        with self._cond:
            self._flush_requests += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._has_pending(), timeout=timeout_s)
            finally:
                self._flush_requests -= 1

    @property
    def reachable(self) -> bool:
        return self._reachable

    def begin_close(self, timeout_s: float) -> None:
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        self._waker.wake()

    def finish_close(self) -> bool:
        # a try in flight may outlast the deadline by one request timeout
        self._thread.join(timeout=max(0.0, self._deadline - time.monotonic()) + 35.0)
        with self._cond:
            if self._thread.is_alive() and self._queue:
                self._spill()
            return not self._queue and self._num_lost == 0

    # --- sender thread ---

    def _mark_pending(self) -> None:
        """Caller holds the lock and is about to add something."""
        if not self._has_pending():
            # the sender sleeps without a timeout while idle: start its batch clock
            self._pending_since = time.monotonic()
            self._cond.notify_all()

    def _has_pending(self) -> bool:
        return bool(self._queue) or self._progress_version != self._sent_progress_version

    def _wait_for_batch(self) -> bool:
        """Block until a batch should go out (True) or the sink is closed and empty (False)."""
        with self._cond:
            while True:
                if self._has_pending():
                    if (
                        self._closing
                        or self._flush_requests
                        or len(self._queue) >= self._batch_max_points
                    ):
                        return True
                    wait_s = self._pending_since + self._batch_s - time.monotonic()
                    if wait_s <= 0:
                        return True
                    self._cond.wait(wait_s)
                elif self._closing:
                    return False
                else:
                    self._cond.wait()

    def _run(self) -> None:
        client = self._client_factory()
        in_flight, in_flight_version = 0, 0
        try:
            while self._wait_for_batch():

                def send_once(budget_s: float) -> None:
                    nonlocal in_flight, in_flight_version
                    with self._cond:
                        points = _within_body_bound(
                            list(itertools.islice(self._queue, self._batch_max_points))
                        )
                        progress, version = self._progress, self._progress_version
                    in_flight, in_flight_version = len(points), version
                    batch: protocol.MetricsBatch = {"attempt": self._attempt, "points": points}
                    if progress is not None and version != self._sent_progress_version:
                        batch["progress"] = progress
                    try:
                        answer = client.post_metrics(batch, budget_s)
                    except TransientError:
                        self._reachable = False
                        raise
                    self._reachable = True
                    if answer is not None and self._on_signals is not None:
                        self._on_signals(answer)
                    self._acknowledge(len(points), version)

                try:
                    retry_transient(
                        send_once,
                        what="POST metrics",
                        deadline=lambda: self._deadline,
                        backoff=self._backoff,
                        waker=self._waker,
                    )
                except ControlPlaneError as exc:
                    if exc.over_quota:
                        self.quota_refusal = str(exc)
                    # a 4xx is a bug on one side: retrying would block every later point
                    print(
                        f"trainhub: the control plane refused {in_flight} metric points; "
                        f"dropping them: {exc}",
                        file=sys.stderr,
                        flush=True,
                    )
                    self._acknowledge(in_flight, in_flight_version)
                    with self._cond:
                        self._num_lost += in_flight
                except DeadlineExceeded as exc:
                    with self._cond:
                        logger.error("trainhub: %s", exc)
                        self._spill()
                    return
        finally:
            client.close()

    def _acknowledge(self, num_points: int, progress_version: int) -> None:
        with self._cond:
            for _ in range(num_points):
                self._queue.popleft()
            self._sent_progress_version = progress_version
            if not self._has_pending():
                self._pending_since = math.inf
            self._cond.notify_all()

    def _spill(self) -> None:
        """Caller holds the lock. Write the undelivered points where a person can find them."""
        points = list(self._queue)
        self._queue.clear()
        self._num_lost += len(points)
        self._sent_progress_version = self._progress_version
        if not points:
            return
        where = "stderr"
        lines = [json.dumps(point) for point in points]
        if self._spill_path is not None:
            try:
                self._spill_path.parent.mkdir(parents=True, exist_ok=True)
                with self._spill_path.open("a", encoding="utf-8") as f:
                    f.writelines(line + "\n" for line in lines)
                where = str(self._spill_path)
            except OSError:
                pass
        print(
            f"trainhub: the control plane stayed unreachable; {len(points)} metric points were "
            f"not delivered and are kept in {where}",
            file=sys.stderr,
            flush=True,
        )
        if where == "stderr":
            for line in lines:
                print(line, file=sys.stderr)


def make_point(step: int, values: dict[str, float]) -> protocol.MetricPoint:
    return {"step": step, "values": values, "time": time.time()}
