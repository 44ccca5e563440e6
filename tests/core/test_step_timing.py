"""The pure parts behind the trial page's "where the time goes" table (shared with the CLI)
and the experiment page's best-so-far curve."""

from __future__ import annotations

import math

import pytest

from trainhub.core.best_so_far import TrialValue, best_so_far
from trainhub.core.step_timing import split_metrics, step_timing


def test_phases_largest_first_with_their_milliseconds_then_the_other_numbers() -> None:
    plain, profiling = split_metrics(
        {
            "step": 7,
            "loss": 0.3,
            "time/data_share": 0.25,
            "time/forward_share": 0.6,
            "time/backward_share": 1.2,  # reported as is, clamped only for the bar
            "time/step_s": 0.2,
            "comm/allreduce_bytes": 10,
            "throughput/samples_per_s": 50.0,
        }
    )
    assert plain == {"loss": 0.3}
    timing = step_timing(profiling)
    assert timing is not None
    assert [p.name for p in timing.phases] == ["backward", "forward", "data"]
    assert [p.ms for p in timing.phases] == pytest.approx([240.0, 120.0, 50.0])
    assert timing.phases[0].bar == 1.0
    assert [k for k, _ in timing.others] == [
        "comm/allreduce_bytes",
        "throughput/samples_per_s",
        "time/step_s",
    ]


def test_without_the_steps_time_phases_have_no_milliseconds_and_nothing_is_none() -> None:
    timing = step_timing({"time/data_share": 0.5})
    assert timing is not None
    assert timing.phases[0].ms is None
    assert step_timing({}) is None


def test_best_so_far_by_completion_order_never_worsens() -> None:
    trials = [
        TrialValue(1, 300.0, 0.2),
        TrialValue(2, 100.0, 0.5),
        TrialValue(3, None, 0.1),  # still running: last
        TrialValue(4, 200.0, 0.7),
        TrialValue(5, 50.0, None),  # no value: left out
        TrialValue(6, 60.0, math.nan),
    ]
    low = best_so_far(trials, "min")
    assert low["trials"] == [2, 4, 1, 3]
    assert low["best"] == [0.5, 0.5, 0.2, 0.1]
    high = best_so_far(trials, "max")
    assert high["best"] == [0.5, 0.7, 0.7, 0.7]
    assert high["x"] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="mode"):
        best_so_far(trials, "median")
