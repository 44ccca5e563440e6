"""The one place that maps a policy name to a policy (service settings, simulator, CLI)."""

from __future__ import annotations

from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.fair import FairSharePolicy
from trainhub.core.scheduling.fair_config import FairShareConfig
from trainhub.core.scheduling.fifo import FifoPolicy
from trainhub.core.scheduling.las import LasConfig, LeastAttainedServicePolicy
from trainhub.core.scheduling.sjf import ShortestJobFirstPolicy

POLICY_NAMES = ("fair", "fifo", "sjf", "las")
DEFAULT_POLICY = "fair"


def create_policy(
    name: str = DEFAULT_POLICY,
    fair: FairShareConfig | None = None,
    las: LasConfig | None = None,
) -> BasePolicy:
    """A new policy by name; ``fair``/``las`` configure those policies."""
    if name == "fair":
        return FairSharePolicy(fair)
    if name == "fifo":
        return FifoPolicy()
    if name == "sjf":
        return ShortestJobFirstPolicy()
    if name == "las":
        return LeastAttainedServicePolicy(las)
    choices = ", ".join(POLICY_NAMES)
    raise ValueError(f"unknown scheduling policy {name!r}; choose one of {choices}")
