"""The chart downsampler keeps what a 2,000-pixel chart shows: every bucket's min and max."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainhub.core.downsample import minmax_downsample


def test_short_series_come_back_whole() -> None:
    xs, ys = minmax_downsample([1, 2, 3], [3.0, 1.0, 2.0], buckets=10)
    assert xs.tolist() == [1, 2, 3]
    assert ys.tolist() == [3.0, 1.0, 2.0]


def test_a_million_points_keep_every_spike_and_dip() -> None:
    rng = np.random.default_rng(0)
    x = np.arange(1_000_000, dtype=np.float64)
    y = rng.normal(size=x.size)
    y[123_456] = 50.0  # one spike
    y[765_432] = -50.0  # one dip
    xs, ys = minmax_downsample(x, y, buckets=2000)
    assert xs.size <= 4 * 2000
    assert 50.0 in ys
    assert -50.0 in ys
    assert np.all(np.diff(xs) > 0)  # in order, each point once
    assert xs[0] == 0
    assert xs[-1] == 999_999


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=400),
    st.integers(1, 20),
)
def test_each_bucket_keeps_its_extremes(values: list[float], buckets: int) -> None:
    x = np.arange(len(values), dtype=np.float64) * 3.0
    y = np.asarray(values)
    xs, ys = minmax_downsample(x, y, buckets)
    kept = dict(zip(xs.tolist(), ys.tolist(), strict=True))
    assert all(y[int(k / 3)] == v for k, v in kept.items())  # only real points
    if len(values) <= 4 * buckets:
        assert xs.size == len(values)
        return
    span = x[-1] - x[0]
    bucket = np.minimum(((x - x[0]) * (buckets / span)).astype(int), buckets - 1)
    for b in np.unique(bucket):
        inside = bucket == b
        mine = [kept[k] for k in x[inside].tolist() if k in kept]
        assert min(mine) == y[inside].min()
        assert max(mine) == y[inside].max()
        assert len(mine) <= 4


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        minmax_downsample([1, 2], [1.0], buckets=1)
    with pytest.raises(ValueError, match="at least 1"):
        minmax_downsample([1], [1.0], buckets=0)
