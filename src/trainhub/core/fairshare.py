"""Fair-share arithmetic: decayed usage and tenant guarantees, as pure functions.

Usage is counted in slot-seconds and decays exponentially with a half-life ``h`` (Slurm's
``PriorityDecayHalfLife``): usage ``u`` seconds ago weighs ``2 ** (-u / h)``. A tenant that holds
``r`` slots steadily converges to a decayed usage of ``r * tau`` with ``tau = h / ln 2`` (the
mean life), so ``usage / tau`` reads as "slots held on average recently".

The service keeps one decayed total per tenant and advances it at each tick with
:func:`advance_usage`; the simulator does the same between events. Both are exact for a
constant allocation between the two instants, so the result does not depend on the tick rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def mean_life_s(half_life_s: float) -> float:
    """``tau``: the decayed usage of one slot held forever."""
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
    return half_life_s / math.log(2.0)


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """How much of the usage counted ``elapsed_s`` ago still weighs now."""
    if elapsed_s < 0:
        raise ValueError(f"elapsed_s must be >= 0, got {elapsed_s}")
    return math.exp(-elapsed_s * math.log(2.0) / half_life_s)


def advance_usage(
    usage: Mapping[str, float],
    slots_held: Mapping[str, float],
    elapsed_s: float,
    half_life_s: float,
) -> dict[str, float]:
    """Decayed usage ``elapsed_s`` later, each tenant having held ``slots_held`` throughout.

    ``U(t + d) = U(t) * f + r * tau * (1 - f)`` with ``f = 2 ** (-d / h)``: the integral of the
    decayed allocation, exact for a constant allocation ``r`` over the interval.
    """
    factor = decay_factor(elapsed_s, half_life_s)
    gain = mean_life_s(half_life_s) * (1.0 - factor)
    tenants = set(usage) | set(slots_held)
    return {t: usage.get(t, 0.0) * factor + slots_held.get(t, 0.0) * gain for t in tenants}


def apportion_guarantees(
    demand: Mapping[str, float], total_slots: int, min_slots: int = 1
) -> dict[str, int]:
    """Split ``total_slots`` between tenants in proportion to ``demand`` (largest remainder).

    Every tenant with positive demand gets at least ``min_slots`` (taken from the largest
    shares); the guarantees add up to ``total_slots`` exactly when there are enough slots for
    the minimums. Tenants are processed in name order, so the result is deterministic.
    """
    if total_slots < 0:
        raise ValueError(f"total_slots must be >= 0, got {total_slots}")
    wanting = sorted(t for t, d in demand.items() if d > 0)
    if not wanting:
        return {}
    total_demand = sum(demand[t] for t in wanting)
    exact = {t: demand[t] / total_demand * total_slots for t in wanting}
    shares = {t: math.floor(exact[t]) for t in wanting}
    left = total_slots - sum(shares.values())
    for t in sorted(wanting, key=lambda t: (-(exact[t] - shares[t]), t))[:left]:
        shares[t] += 1
    for t in wanting:
        while shares[t] < min_slots:
            donor = max(wanting, key=lambda d: (shares[d], d))
            if shares[donor] <= min_slots:
                break
            shares[donor] -= 1
            shares[t] += 1
    return {t: shares[t] for t in wanting}


def jain_index(values: Mapping[str, float] | list[float]) -> float:
    """Jain's fairness index of non-negative values: 1 when all equal, 1/n at worst."""
    xs = list(values.values()) if isinstance(values, Mapping) else list(values)
    if not xs:
        return 1.0
    square_sum = sum(x * x for x in xs)
    if square_sum == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * square_sum)
