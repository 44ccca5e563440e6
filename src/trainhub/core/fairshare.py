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
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol


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


class UsageInterval(Protocol):
    """Slots a tenant held from ``start`` to ``end`` (None: still holds them)."""

    @property
    def tenant(self) -> str: ...
    @property
    def num_slots(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float | None: ...


class DecayedUsage(Mapping[str, float]):
    """Each tenant's decayed slot-seconds: the one ledger of the control plane and simulator.

    Each tenant keeps the slots it holds and the time it was last settled; a read or a change
    integrates the constant holding over the gap (:func:`advance_usage`'s formula, exact for
    a constant holding), so the cost is per change and the result does not depend on how
    often it is read. Read at :attr:`now` as a mapping (what a ``Snapshot`` takes).

    - the simulator calls :meth:`change` at each start and end of a job;
    - the control plane rebuilds it from the attempts table at start (:meth:`rebuild`), then
      calls :meth:`advance` each tick with what every tenant holds.
    """

    def __init__(
        self, half_life_s: float, start_s: float | None = None, tenants: Iterable[str] = ()
    ) -> None:
        self.half_life_s = half_life_s
        self._rate = math.log(2.0) / half_life_s
        self._tau = mean_life_s(half_life_s)
        self._value: dict[str, float] = dict.fromkeys(tenants, 0.0)
        self._held: dict[str, float] = dict.fromkeys(tenants, 0.0)
        self._since: dict[str, float] = dict.fromkeys(tenants, start_s or 0.0)
        self._at = start_s
        self.now = start_s or 0.0

    @property
    def initialized(self) -> bool:
        """Whether it has a time (from ``start_s``, :meth:`rebuild` or :meth:`advance`)."""
        return self._at is not None

    def _settle(self, tenant: str, now: float) -> float:
        since = self._since.get(tenant)
        if since is None:
            self._value[tenant] = 0.0
            self._held[tenant] = 0.0
            self._since[tenant] = now
            return 0.0
        span = now - since
        if span > 0:
            factor = math.exp(-span * self._rate)
            self._value[tenant] = self._value[tenant] * factor + self._held[tenant] * self._tau * (
                1.0 - factor
            )
            self._since[tenant] = now
        return self._value[tenant]

    def change(self, tenant: str, now: float, held: float) -> None:
        """``tenant`` holds ``held`` more slots (fewer when negative) from ``now`` on."""
        self._settle(tenant, now)
        self._held[tenant] += held
        if self._at is None or now > self._at:
            self._at = now

    def advance(self, slots_held: Mapping[str, float], now: float) -> Mapping[str, float]:
        """Every tenant held ``slots_held`` since the last call; the usage at ``now``."""
        if self._at is not None and now > self._at:
            for tenant in set(self._value) | set(slots_held):
                if tenant not in self._since:
                    self._settle(tenant, self._at)
                self._held[tenant] = slots_held.get(tenant, 0.0)
                self._settle(tenant, now)
        else:
            for tenant in slots_held:
                self._settle(tenant, now if self._at is None else self._at)
                self._held[tenant] = slots_held[tenant]
        self._at = now if self._at is None else max(self._at, now)
        self.now = self._at
        return {t: self._settle(t, self._at) for t in self._value}

    def rebuild(self, intervals: Iterable[UsageInterval], now: float) -> None:
        """The usage at ``now`` of these holdings, exactly (the attempts table at start-up)."""
        usage: dict[str, float] = {}
        tau = self._tau
        for a in intervals:
            end = min(a.end if a.end is not None else now, now)
            if end <= a.start or a.num_slots <= 0:
                continue
            usage[a.tenant] = usage.get(a.tenant, 0.0) + a.num_slots * tau * (
                math.exp(-(now - end) / tau) - math.exp(-(now - a.start) / tau)
            )
        self._value = usage
        self._held = dict.fromkeys(usage, 0.0)
        self._since = dict.fromkeys(usage, now)
        self._at = self.now = now

    def __getitem__(self, tenant: str) -> float:
        if tenant not in self._value:
            raise KeyError(tenant)
        return self._settle(tenant, self.now)

    def __iter__(self) -> Iterator[str]:
        return iter(self._value)

    def __len__(self) -> int:
        return len(self._value)


def scaled_guarantees(guarantees: Mapping[str, int], total_slots: int) -> dict[str, int]:
    """Guarantees the cluster can honour: unchanged when they add up to at most
    ``total_slots``; else scaled in proportion to add up to it exactly (largest remainder,
    at least one slot for each tenant that had one while there are enough slots)."""
    total = sum(guarantees.values())
    if total <= total_slots:
        return dict(guarantees)
    scaled = apportion_guarantees({t: float(g) for t, g in guarantees.items()}, total_slots)
    return {t: scaled.get(t, 0) for t in guarantees}


def guarantee_note(
    guarantees: Mapping[str, int], total_slots: int, unit: str = "GPUs"
) -> str | None:
    """The words that tell users their guarantees were scaled down, or None if they were not;
    ``unit`` names the slots (CPUs on a cluster without GPUs)."""
    total = sum(guarantees.values())
    if total <= total_slots:
        return None
    return (
        f"tenant guarantees add up to {total} {unit}, more than the cluster's {total_slots}: "
        f"each is scaled down by {total_slots / total:.2f}"
    )
