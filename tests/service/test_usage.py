"""Usage accounting and decayed usage, on plain values."""

from __future__ import annotations

import math

import pytest

from trainhub.service.records import AttemptUsage
from trainhub.service.usage import DAY_S, DecayedUsage, account, split_by_day


def usage(
    tenant: str, slots: int, start: float, end: float | None, user: str = "u"
) -> AttemptUsage:
    return AttemptUsage(tenant, user, "p", 1, slots, start, end)


def test_split_by_day_cuts_at_utc_midnight() -> None:
    pieces = list(split_by_day(DAY_S - 600, DAY_S + 1200))
    assert pieces == [("1970-01-01", 600.0), ("1970-01-02", 1200.0)]


def test_account_clips_to_the_period_and_groups() -> None:
    attempts = [
        usage("a", 4, 0, 3600),  # 4 slot-hours
        usage("a", 2, 1800, None),  # still running: counted until `until`
        usage("b", 8, -3600, 1800, user="v"),  # began before the period
        usage("b", 8, 100, 100),  # empty
    ]
    totals = account(attempts, since=0, until=7200)
    assert totals[("1970-01-01", "a", "u", "p")] == pytest.approx(4 * 3600 + 2 * 5400)
    assert totals[("1970-01-01", "b", "v", "p")] == pytest.approx(8 * 1800)
    assert len(totals) == 2


def test_decayed_usage_rebuilt_from_history_equals_advancing_tick_by_tick() -> None:
    half_life = 3600.0
    ticking = DecayedUsage(half_life)
    ticking.advance({}, 0.0)
    for t in range(60, 7200 + 1, 60):
        held = {"a": 4.0} if t <= 3600 else {"a": 0.0, "b": 2.0}
        ticking.advance(held, float(t))
    rebuilt = DecayedUsage(half_life)
    rebuilt.rebuild([usage("a", 4, 0, 3600), usage("b", 2, 3600, None)], now=7200.0)
    result = rebuilt.advance({}, 7200.0)
    expected = ticking.advance({}, 7200.0)
    assert result["a"] == pytest.approx(expected["a"])
    assert result["b"] == pytest.approx(expected["b"])
    # one slot held for a half-life weighs tau * (1 - 1/2)
    tau = half_life / math.log(2)
    assert result["b"] == pytest.approx(2 * tau * 0.5)


def test_guarantee_kept_is_received_over_entitled_slot_time_in_the_period() -> None:
    from trainhub.core.entitlement import Interval
    from trainhub.service.usage import guarantees_kept

    # a (guarantee 4) wants 6 slots for an hour and holds 2: entitled to 4, receives 2; then it
    # wants 1 and holds it for another hour. b has no guarantee: entitled to nothing.
    held = [usage("a", 2, 0, 3600), usage("a", 1, 3600, None), usage("b", 8, 0, None)]
    demand = [
        Interval("a", 6, 0.0, 3600.0),
        Interval("a", 1, 3600.0, None),
        Interval("b", 8, 0.0, None),
    ]
    kept = guarantees_kept(held, demand, {"a": 4, "b": 0}, 0.0, 7200.0)
    assert kept == {"a": pytest.approx((2 * 3600 + 1 * 3600) / (4 * 3600 + 1 * 3600))}
    # the period starts half-way through the first hour: only what lies inside counts
    later = guarantees_kept(held, demand, {"a": 4}, 1800.0, 7200.0)
    assert later["a"] == pytest.approx((2 * 1800 + 3600) / (4 * 1800 + 3600))
