"""Chart data of a trial's metrics: every point kept in memory per trial, downsampled per request.

Reading a million metric rows from the database takes seconds; a chart that follows a live
trial asks every few seconds. So the series of recently viewed trials stay in memory as numpy
arrays, and each request reads only the rows after the last step seen (through the tracking
service, which also checks that the caller may read the trial). A new attempt may report
steps again (resuming from a checkpoint), so the series is read afresh when the number of
attempts changed.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from trainhub.core.downsample import DEFAULT_BUCKETS, minmax_downsample
from trainhub.core.step_timing import is_runtime_metric
from trainhub.service.container import Services
from trainhub.service.ports import Principal
from trainhub.service.records import MetricChunk

_READ_ROWS = 100_000
_CACHED_TRIALS = 16
_DRAWN_KEPT = 8  # downsampled views kept per trial (full view, zooms)


@dataclass
class _Series:
    attempts: int
    last_step: int | None = None
    steps: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    values: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)
    # downsampled series by bucket count, until new points arrive
    drawn: dict[tuple[int, tuple[float, float] | None], dict[str, Any]] = field(
        default_factory=dict
    )

    def extend(self, steps: list[int], rows: list[dict[str, float]]) -> None:
        new_steps = np.asarray(steps, dtype=np.float64)
        names = set(self.values).union(*(r.keys() for r in rows))
        for name in names:
            old = self.values.get(name)
            if old is None:
                old = np.full(self.steps.size, math.nan)
            new = np.fromiter(
                (r.get(name, math.nan) for r in rows), dtype=np.float64, count=len(rows)
            )
            self.values[name] = np.concatenate((old, new))
        self.steps = np.concatenate((self.steps, new_steps))
        self.last_step = steps[-1]
        self.drawn.clear()

    def load(
        self, steps: npt.NDArray[np.float64], values: dict[str, npt.NDArray[np.float64]]
    ) -> None:
        self.steps, self.values = steps, values
        self.last_step = int(steps[-1]) if steps.size else None
        self.drawn.clear()

    def downsampled(
        self, buckets: int, x_range: tuple[float, float] | None = None
    ) -> dict[str, Any]:
        """Each metric downsampled to ``buckets``; within ``x_range`` (a zoom) when given,
        with the points just outside it, so the lines reach the chart's edges."""
        key = (buckets, x_range)
        metrics = self.drawn.get(key)
        if metrics is None:
            lo, hi = 0, self.steps.size
            if x_range is not None:
                lo = max(0, int(np.searchsorted(self.steps, x_range[0], "left")) - 1)
                hi = min(self.steps.size, int(np.searchsorted(self.steps, x_range[1], "right")) + 1)
            steps = self.steps[lo:hi]
            metrics = {}
            # the script's own metrics first, then what the runtime reports by itself
            for name, all_values in sorted(
                self.values.items(), key=lambda item: (is_runtime_metric(item[0]), item[0])
            ):
                values = all_values[lo:hi]
                present = ~np.isnan(values)
                if present.all():
                    xs, ys = minmax_downsample(steps, values, buckets)
                else:
                    xs, ys = minmax_downsample(steps[present], values[present], buckets)
                metrics[name] = {"x": xs.tolist(), "y": ys.tolist()}
            if x_range is not None and len(self.drawn) >= _DRAWN_KEPT:
                self.drawn.clear()  # zooms come and go: keep a few
            self.drawn[key] = metrics
        return metrics


def unpack_chunks(
    chunks: list[MetricChunk],
) -> tuple[npt.NDArray[np.float64], dict[str, npt.NDArray[np.float64]]]:
    """(sorted distinct steps, {name: values aligned to them, NaN where absent}) from packed
    chunks, as the metric rows hold them: a later chunk's value of a step replaces an earlier
    one's, and a step reported by a later attempt keeps only that attempt's values."""
    if not chunks:
        return np.zeros(0), {}
    all_steps = np.concatenate(
        [np.frombuffer(c.steps, dtype="<i8", count=c.num_points) for c in chunks]
    )
    steps, where = np.unique(all_steps, return_inverse=True)
    newest = np.full(steps.size, -1, dtype=np.int64)  # the latest attempt that reported a step
    np.maximum.at(
        newest, where, np.repeat([c.attempt for c in chunks], [c.num_points for c in chunks])
    )
    values: dict[str, npt.NDArray[np.float64]] = {}
    offset = 0
    for chunk in chunks:
        index = where[offset : offset + chunk.num_points]
        offset += chunk.num_points
        column = values.get(chunk.name)
        if column is None:
            column = values[chunk.name] = np.full(steps.size, math.nan)
        keep = newest[index] == chunk.attempt
        column[index[keep]] = np.frombuffer(chunk.values, dtype="<f8", count=chunk.num_points)[keep]
    return steps.astype(np.float64), values


class ChartCache:
    def __init__(self, services: Services, max_trials: int = _CACHED_TRIALS) -> None:
        self.services = services
        self.max_trials = max_trials
        self._series: OrderedDict[int, _Series] = OrderedDict()
        self._lock = threading.Lock()

    def _refresh(self, principal: Principal, trial_id: int, attempts: int) -> _Series:
        with self._lock:
            series = self._series.get(trial_id)
            if series is None or series.attempts != attempts:
                series = _Series(attempts)
            self._series[trial_id] = series
            self._series.move_to_end(trial_id)
            while len(self._series) > self.max_trials:
                self._series.popitem(last=False)
            if series.last_step is None:  # a first read: the packed chunks, if complete
                chunks, rows = self.services.tracking.metric_chunks(principal, trial_id)
                if rows and chunks:
                    steps, values = unpack_chunks(chunks)
                    if steps.size == rows:
                        series.load(steps, values)
            while True:
                # checks the caller may read the trial, every time
                points = self.services.tracking.list_metrics(
                    principal, trial_id, series.last_step, _READ_ROWS
                )
                if not points:
                    return series
                series.extend([p.step for p in points], [p.values for p in points])
                if len(points) < _READ_ROWS:
                    return series

    def chart(
        self,
        principal: Principal,
        trial_id: int,
        attempts: int,
        buckets: int = DEFAULT_BUCKETS,
        x_range: tuple[float, float] | None = None,
    ) -> dict[str, Any]:
        """{"points": n, "metrics": {name: {"x": [...], "y": [...]}}}, each downsampled (within
        ``x_range`` of steps when zoomed: the detail of that range at full resolution)."""
        series = self._refresh(principal, trial_id, attempts)
        with self._lock:
            return {
                "points": int(series.steps.size),
                "metrics": series.downsampled(buckets, x_range),
            }
