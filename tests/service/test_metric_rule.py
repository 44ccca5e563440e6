"""The whole-batch check of metric points agrees with the rule checked point by point."""

from __future__ import annotations

import math

import pytest

from trainhub.core import limits
from trainhub.service.tracking import _points_valid, check_metric_values

Points = list[tuple[int, dict[str, float]]]


def slow_errors(points: Points) -> int:
    errors = 0
    for i, (step, values) in enumerate(points):
        errors += not 0 <= step <= limits.INT64_MAX
        errors += len(check_metric_values(values, f"points.{i}.values"))
    return errors


VALID: list[Points] = [
    [],
    [(0, {})],
    [(0, {"loss": 0.5, "epoch": 3}), (limits.INT64_MAX, {"a/b.c-d_e": -1e3})],
    [(1, {"n": limits.INT64_MIN}), (2, {"n": limits.INT64_MAX})],
    [(step, {"loss": 1.0 / (step + 1)}) for step in range(1000)],
]
INVALID: list[Points] = [
    [(0, {"loss": math.nan})],
    [(0, {"loss": 1.0}), (1, {"loss": math.inf})],
    [(0, {"loss": -math.inf, "x": math.inf})],
    [(0, {"ok": True})],  # type: ignore[dict-item]
    [(0, {"ok": "0.7"})],  # type: ignore[dict-item]
    [(0, {"ok": None})],  # type: ignore[dict-item]
    [(0, {"big": limits.INT64_MAX + 1})],
    [(0, {"small": limits.INT64_MIN - 1})],
    [(0, {"huge": 10**400})],
    [(0, {"huge": 10**400, "f": 1.0})],
    [(0, {"a b": 1.0})],
    [(0, {"": 1.0})],
    [(0, {"x" * 129: 1.0})],
    [(-1, {"loss": 1.0})],
    [(limits.INT64_MAX + 1, {"loss": 1.0})],
    [(0, {f"m{i}": 1.0 for i in range(limits.MAX_METRICS_PER_POINT + 1)})],
]


@pytest.mark.parametrize("points", VALID)
def test_valid_batches_pass_without_the_slow_path(points: Points) -> None:
    assert slow_errors(points) == 0
    assert _points_valid(points)


@pytest.mark.parametrize("points", INVALID)
def test_invalid_batches_always_go_to_the_slow_path(points: Points) -> None:
    assert slow_errors(points) > 0
    assert not _points_valid(points)


@pytest.mark.parametrize("values", [{"a": 1e308, "b": 1e308}, {"far": -1e300}, {"far": 1e19}])
def test_valid_floats_out_of_the_fast_range_only_ask_for_a_closer_look(
    values: dict[str, float],
) -> None:
    points: Points = [(0, values)]
    assert slow_errors(points) == 0
    assert not _points_valid(points)  # then checked point by point, and stored
