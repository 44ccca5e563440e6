"""Downsampling a metric series for a chart without losing what would show.

A chart ``width`` pixels wide shows, in each pixel column, a vertical stroke from the lowest to
the highest value that falls in it. Keeping the first point, the minimum, the maximum and the
last point of each bucket (in their order along x) therefore draws the same picture as every
point: spikes and dips survive, and a million points become at most ``4 * buckets``.
Buckets are equal spans of x (steps), as pixel columns are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

DEFAULT_BUCKETS = 2000


def minmax_downsample(
    xs: Sequence[float] | npt.NDArray[np.float64],
    ys: Sequence[float] | npt.NDArray[np.float64],
    buckets: int = DEFAULT_BUCKETS,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The points of (xs, ys) a ``buckets``-pixel chart needs; xs must be sorted ascending.

    Keeps, per bucket of x, the first, lowest, highest and last point, in x order, each once.
    Series of at most ``4 * buckets`` points are returned whole.
    """
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("xs and ys must be one-dimensional and of the same length")
    n = x.size
    if n <= 4 * buckets:
        return x.copy(), y.copy()
    span = x[-1] - x[0]
    if span <= 0:
        bucket = np.zeros(n, dtype=np.int64)
    else:
        bucket = np.minimum(((x - x[0]) * (buckets / span)).astype(np.int64), buckets - 1)
    # buckets are contiguous runs because x is sorted
    starts = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    ends = np.concatenate((starts[1:], [n])) - 1
    run = np.cumsum(np.concatenate(([False], bucket[1:] != bucket[:-1])))
    keep = np.zeros(n, dtype=bool)
    for extreme in (np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts)):
        hits = np.flatnonzero(y == extreme[run])  # every point equal to its run's extreme
        first = np.concatenate(([True], run[hits][1:] != run[hits][:-1]))
        keep[hits[first]] = True  # the first of them in each run
    keep[starts] = True
    keep[ends] = True
    return x[keep], y[keep]
