"""The one place that names the policies, picks the default and builds one by name.

Server settings, the simulator, ``trainhub server --policy`` and ``trainhub sim --policy`` all
read their choices, default and help text from here (a registry, not an if-chain).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.fair import FairSharePolicy
from trainhub.core.scheduling.fair_config import FairShareConfig
from trainhub.core.scheduling.fifo import FifoPolicy
from trainhub.core.scheduling.las import LasConfig, LeastAttainedServicePolicy
from trainhub.core.scheduling.sjf import ShortestJobFirstPolicy


@dataclass(frozen=True)
class PolicyEntry:
    """A policy's name, what it does in a few words, and how to build it."""

    name: str
    summary: str
    build: Callable[[FairShareConfig | None, LasConfig | None], BasePolicy]


_REGISTRY: tuple[PolicyEntry, ...] = (
    PolicyEntry(
        "fair",
        "fair share: tenant guarantees, backfill and preemption",
        lambda fair, _las: FairSharePolicy(fair),
    ),
    PolicyEntry("fifo", "first in, first out", lambda _fair, _las: FifoPolicy()),
    PolicyEntry(
        "sjf", "shortest (expected) job first", lambda _fair, _las: ShortestJobFirstPolicy()
    ),
    PolicyEntry(
        "las", "least attained service first", lambda _fair, las: LeastAttainedServicePolicy(las)
    ),
)
POLICIES: dict[str, PolicyEntry] = {entry.name: entry for entry in _REGISTRY}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
DEFAULT_POLICY = "fair"


def policy_help(default: str | None = DEFAULT_POLICY) -> str:
    """One line for a CLI option's help: every policy with its summary, and the default."""
    text = "; ".join(f"{e.name}: {e.summary}" for e in _REGISTRY)
    return f"Scheduling policy ({text})" + (f"; default: {default}." if default else ".")


def create_policy(
    name: str = DEFAULT_POLICY,
    fair: FairShareConfig | None = None,
    las: LasConfig | None = None,
) -> BasePolicy:
    """A new policy by name; ``fair``/``las`` configure those policies."""
    entry = POLICIES.get(name)
    if entry is None:
        choices = ", ".join(POLICY_NAMES)
        raise ValueError(f"unknown scheduling policy {name!r}; choose one of {choices}")
    return entry.build(fair, las)
