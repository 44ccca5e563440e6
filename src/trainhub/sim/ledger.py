"""Per-tenant fairness accounting over simulated time: the benchmark's measure.

It is :class:`~trainhub.core.entitlement.EntitlementLedger` without decay: at each instant a
tenant is entitled to ``min(guarantee, demand)`` and receives ``min(held, entitled)``, and the
fairness of a run is received over entitled GPU-time from its start. The policy reads the same
ledger with a half-life (its standings); this one measures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trainhub.core.entitlement import EntitlementLedger


class TenantTimeline(EntitlementLedger):
    """Undecayed entitled and received GPU-time per tenant against its guarantee."""

    def __init__(self, tenants: Sequence[str], guarantees: Mapping[str, int], start_s: float):
        super().__init__(math.inf)
        self.set_guarantees({t: guarantees.get(t, 0) for t in tenants}, start_s)
        self._settled_at = start_s
        # the most slots each tenant demanded at once (queued and running)
        self.peak_demand: dict[str, float] = {}

    def change(self, tenant: str, now: float, held: float = 0.0, demand: float = 0.0) -> None:
        super().change(tenant, now, held, demand)
        if demand > 0:
            now_demand = self._accounts[tenant].demand
            if now_demand > self.peak_demand.get(tenant, 0.0):
                self.peak_demand[tenant] = now_demand

    def within_guarantee(self) -> list[str]:
        """Tenants whose demand never went past their guarantee (and demanded anything)."""
        return sorted(
            t for t, peak in self.peak_demand.items() if 0 < peak <= self._accounts[t].guarantee
        )

    def settle(self, now: float) -> None:
        """Account every tenant up to ``now`` (what :meth:`ratios` reads)."""
        self._settled_at = now

    def ratios(self) -> dict[str, float]:
        """Received over entitled GPU-time, for tenants entitled to anything."""
        return {
            t: s.received_slot_s / s.entitled_slot_s
            for t, s in self.standing(self._settled_at).items()
            if s.entitled_slot_s > 0
        }
