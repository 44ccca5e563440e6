"""The entitlement ledger: decayed received and entitled slot-seconds per tenant."""

from __future__ import annotations

import math

import pytest

from trainhub.core.entitlement import EntitlementLedger, Interval, Standing
from trainhub.core.fairshare import mean_life_s

HALF_LIFE_S = 3600.0
TAU = mean_life_s(HALF_LIFE_S)


def decayed(rate: float, span: float) -> float:
    """What ``rate`` slots held for ``span`` seconds up to now weigh (one constant holding)."""
    return rate * TAU * -math.expm1(-span / TAU)


def test_entitled_is_the_guarantee_or_the_demand_and_received_what_was_held_of_it() -> None:
    ledger = EntitlementLedger(HALF_LIFE_S)
    ledger.set_guarantees({"a": 4, "b": 4}, 0.0)
    ledger.change("a", 0.0, held=2, demand=6)  # entitled to 4, receives 2
    ledger.change("b", 0.0, held=6, demand=6)  # entitled to 4, receives 4 (not the 2 borrowed)
    got = ledger.standing(1000.0)
    assert got["a"].entitled_slot_s == pytest.approx(decayed(4, 1000.0))
    assert got["a"].received_slot_s == pytest.approx(decayed(2, 1000.0))
    assert got["b"].received_slot_s == pytest.approx(got["b"].entitled_slot_s)
    assert got["a"].surplus_slot_s(0.5) == pytest.approx(0.0)


def test_a_tenant_without_demand_is_entitled_to_nothing() -> None:
    ledger = EntitlementLedger(HALF_LIFE_S)
    ledger.set_guarantees({"a": 8}, 0.0)
    ledger.change("a", 0.0, held=0, demand=0)
    assert ledger.standing(500.0)["a"] == Standing(0.0, 0.0)


def test_old_shortfalls_fade_with_the_half_life() -> None:
    ledger = EntitlementLedger(HALF_LIFE_S)
    ledger.set_guarantees({"a": 4}, 0.0)
    ledger.change("a", 0.0, demand=4)  # owed 4, gets nothing for an hour
    ledger.change("a", 3600.0, held=4)  # then gets all of it
    early = ledger.standing(3600.0)["a"]
    later = ledger.standing(5 * 3600.0)["a"]
    assert early.received_slot_s == 0.0
    assert later.received_slot_s / later.entitled_slot_s > 0.9
    # the hour without anything weighs 2**-4 of what it weighed then
    missing = later.entitled_slot_s - later.received_slot_s
    assert missing == pytest.approx(early.entitled_slot_s / 16)


def test_ticks_and_events_give_the_same_standing() -> None:
    """The control loop observes each tick what the simulator is told at each change."""
    events = EntitlementLedger(HALF_LIFE_S)
    ticks = EntitlementLedger(HALF_LIFE_S)
    for ledger in (events, ticks):
        ledger.set_guarantees({"a": 4, "b": 2}, 0.0)
    events.change("a", 0.0, demand=6)
    events.change("a", 100.0, held=4)
    events.change("b", 100.0, held=2, demand=3)
    events.change("a", 700.0, held=-4, demand=-4)
    ticks.observe({}, {"a": 6}, 0.0)
    ticks.observe({"a": 4, "b": 2}, {"a": 6, "b": 3}, 100.0)
    ticks.observe({"b": 2}, {"a": 2, "b": 3}, 700.0)
    at = 2000.0
    for tenant in ("a", "b"):
        assert events.standing(at)[tenant].entitled_slot_s == pytest.approx(
            ticks.standing(at)[tenant].entitled_slot_s
        )
        assert events.standing(at)[tenant].received_slot_s == pytest.approx(
            ticks.standing(at)[tenant].received_slot_s
        )


def test_a_changed_guarantee_counts_from_its_change() -> None:
    ledger = EntitlementLedger(HALF_LIFE_S)
    ledger.set_guarantees({"a": 2}, 0.0)
    ledger.change("a", 0.0, held=0, demand=8)
    ledger.set_guarantees({"a": 6}, 1000.0)
    got = ledger.standing(2000.0)["a"]
    expected = decayed(2, 1000.0) * math.exp(-1000.0 / TAU) + decayed(6, 1000.0)
    assert got.entitled_slot_s == pytest.approx(expected)


def test_a_rebuild_from_history_equals_the_ledger_kept_change_by_change() -> None:
    kept = EntitlementLedger(HALF_LIFE_S)
    kept.set_guarantees({"a": 4, "b": 2}, 0.0)
    kept.change("a", 0.0, demand=6)
    kept.change("a", 100.0, held=4)
    kept.change("b", 200.0, held=2, demand=2)
    kept.change("a", 900.0, held=-4, demand=-4)
    held = [Interval("a", 4, 100.0, 900.0), Interval("b", 2, 200.0, None)]
    demanded = [
        Interval("a", 4, 0.0, 900.0),
        Interval("a", 2, 0.0, None),
        Interval("b", 2, 200.0, None),
        Interval("b", 8, 5000.0, None),  # after now: not yet
    ]
    rebuilt = EntitlementLedger(HALF_LIFE_S)
    rebuilt.rebuild(held, demanded, {"a": 4, "b": 2}, 3000.0)
    for tenant in ("a", "b"):
        assert rebuilt.standing(3000.0)[tenant].entitled_slot_s == pytest.approx(
            kept.standing(3000.0)[tenant].entitled_slot_s
        )
        assert rebuilt.standing(3000.0)[tenant].received_slot_s == pytest.approx(
            kept.standing(3000.0)[tenant].received_slot_s
        )
