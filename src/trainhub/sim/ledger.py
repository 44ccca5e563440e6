"""Per-tenant accounting over simulated time, settled lazily.

A tenant's counters change only at its own events, so each tenant keeps the time it was last
settled and integrates its constant values over the gap when it next changes (or when someone
reads it): the cost is per change, not per event times the number of tenants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class TenantTimeline:
    """GPUs each tenant holds and demands, with entitled/received GPU-time against guarantees.

    At each instant a tenant is entitled to ``min(guarantee, demand)`` and receives
    ``min(held, entitled)``; demand is the GPUs of its queued and running jobs.
    """

    def __init__(self, tenants: Sequence[str], guarantees: Mapping[str, int], start_s: float):
        self.tenants = list(tenants)
        self.guarantees = {t: guarantees.get(t, 0) for t in self.tenants}
        self.held: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self.demand: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self.held_gpu_s: dict[str, float] = dict.fromkeys(self.tenants, 0.0)
        self.entitled_gpu_s: dict[str, float] = dict.fromkeys(self.tenants, 0.0)
        self.received_gpu_s: dict[str, float] = dict.fromkeys(self.tenants, 0.0)
        self._since: dict[str, float] = dict.fromkeys(self.tenants, start_s)

    def _settle(self, tenant: str, now: float) -> None:
        span = now - self._since[tenant]
        if span <= 0:
            return
        self._since[tenant] = now
        have = self.held[tenant]
        self.held_gpu_s[tenant] += have * span
        entitled = min(self.guarantees[tenant], self.demand[tenant])
        if entitled:
            self.entitled_gpu_s[tenant] += entitled * span
            self.received_gpu_s[tenant] += min(have, entitled) * span

    def change(self, tenant: str, now: float, held: int = 0, demand: int = 0) -> None:
        self._settle(tenant, now)
        self.held[tenant] += held
        self.demand[tenant] += demand

    def settle(self, now: float) -> None:
        for tenant in self.tenants:
            self._settle(tenant, now)

    def ratios(self) -> dict[str, float]:
        """Received over entitled GPU-time, for tenants entitled to anything."""
        return {
            t: self.received_gpu_s[t] / self.entitled_gpu_s[t]
            for t in self.tenants
            if self.entitled_gpu_s[t] > 0
        }
