"""The network of a simulated cluster: a bandwidth per topology level, and the step-time
penalty of a gang whose ranks span a wider level than they needed (issue 30).

A level's bandwidth is what one rank gets to its peers when the gang's widest span is that
level: within a node (NVLink/PCIe), within a rack (the top-of-rack switch), within a block
(the rack uplinks), across the cluster (the spine). A job's trace duration is its run time
at its *ideal* span: one node when its GPUs fit one, else one rack, else one block. Spanning
a wider level makes the communicating share of each step slower by the bandwidth ratio:

    slowdown = (1 - comm_share) + comm_share * bandwidth(ideal) / bandwidth(spanned)

So a gang that needs one rack but is put across two racks of a block with 4x less bandwidth
per rank and 30% of its step in communication runs 0.7 + 0.3 * 4 = 1.9x as long.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SPANS = ("node", "rack", "block", "cluster")


def _default_bandwidth() -> dict[str, float]:
    # Gb/s per rank, a DGX-like node on a 2-tier fabric: NVLink, ToR, rack uplinks, spine
    return {"node": 2400.0, "rack": 400.0, "block": 100.0, "cluster": 50.0}


@dataclass(frozen=True)
class NetworkModel:
    bandwidth_gbps: Mapping[str, float] = field(default_factory=_default_bandwidth)
    comm_share: float = 0.3  # of a step at the ideal span

    def __post_init__(self) -> None:
        if not 0 <= self.comm_share <= 1:
            raise ValueError("comm_share must be in [0, 1]")
        missing = [s for s in SPANS if self.bandwidth_gbps.get(s, 0) <= 0]
        if missing:
            raise ValueError(f"a bandwidth > 0 is needed for {', '.join(missing)}")

    def slowdown(self, ideal: str, spanned: str) -> float:
        if SPANS.index(spanned) <= SPANS.index(ideal):
            return 1.0
        ratio = self.bandwidth_gbps[ideal] / self.bandwidth_gbps[spanned]
        return (1.0 - self.comm_share) + self.comm_share * ratio


def span_of(placement: Sequence[str], labels: Mapping[str, Mapping[str, str]]) -> str:
    """The widest level a placement spans: node, rack, block or cluster (a node without the
    label of a level counts as a domain of its own there)."""
    nodes = set(placement)
    if len(nodes) <= 1:
        return "node"
    for level in ("rack", "block"):
        domains = {labels.get(n, {}).get(level) or f"?{n}" for n in nodes}
        if len(domains) == 1:
            return level
    return "cluster"


def ideal_span(num_gpus: int, largest: Mapping[str, int]) -> str:
    """The tightest level whose largest domain holds ``num_gpus`` GPUs."""
    for level in ("node", "rack", "block"):
        if num_gpus <= largest.get(level, 0):
            return level
    return "cluster"
