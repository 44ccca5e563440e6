"""Topology levels of a cluster (issue 30): nodes sit in racks, racks in blocks.

A node carries its levels as labels (``rack=r3``, ``block=b1``): from its agent's configuration
or from ``trainhub nodes label NODE rack=r3 block=b1`` (stored; a stored label wins). A node
without the label of a level is in that level's ``unknown`` domain, which a gang that requires
the level never uses (its ranks could be anywhere) and a gang that prefers it uses only when no
real domain fits.

A gang that *requires* a level has all its ranks in one domain of it (one rack); one that
*prefers* a level gets one domain when one fits now, else goes where plain placement puts it.
Among the domains that fit, the tightest (fewest free GPUs) is chosen: best fit, which keeps
the emptier domains whole for the larger gangs (core/scheduling/nodepool.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LEVELS = ("rack", "block")  # from the tightest to the widest
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class TopologyNeed:
    """What a gang asks of the topology: one domain of ``level``, required or preferred."""

    level: str
    required: bool

    def describe(self) -> str:
        return f"{'in' if self.required else 'preferably in'} one {self.level}"


def domain_of(labels: Mapping[str, str], level: str) -> str:
    """The node's domain at ``level`` (``unknown`` without the label)."""
    return labels.get(level) or UNKNOWN


def parse_labels(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["rack=r3", "block=b1"]`` as a mapping; ``rack=`` (empty) removes the label."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{pair!r} is not KEY=VALUE (e.g. rack=r3)")
        out[key.strip()] = value.strip()
    return out
