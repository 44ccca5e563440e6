"""What a trial's ranks send and receive over the network: the two sources and their reconciling.

Two sources see a trial's traffic (docs/adr/0045):

* **the kernel**: the byte counters of the interfaces of the trial's network namespace on a
  node (one namespace per attempt and node, shared by the attempt's ranks there; ADR 0027,
  0030). ``lo`` carries what the node's ranks send each other (*intra-node*) and, besides, the
  connections to the API relay (not training traffic: the relay counts those bytes itself and
  they are taken off); every other interface (``trial0``, the VXLAN tunnel between the trial's
  nodes; a veth, were there one) carries what goes to the trial's other nodes (*inter-node*).
  The kernel sees everything that goes through sockets: collectives, the rendezvous store, a
  script's own connections, retransmissions, headers. It does not see what bypasses the
  kernel: NCCL over RDMA (InfiniBand/RoCE) or NVLink/shared memory.
* **the communication hooks** (runtime/distributed/comm_meter.py): the bytes each rank hands
  to its collectives, turned into wire bytes with the ring algorithms' formulas. They see
  collectives only, whatever carries them, and nothing else. Where a rank's ring successor sits
  says the scope of what it sends (:func:`hook_scopes`).

Per node, scope and direction the larger of the two is attributed (:func:`reconcile`): each
source undercounts in a way the other does not (the hooks miss non-collective traffic, the
kernel misses bypassing traffic), and both measure the same collective flows, so the larger
never counts a byte twice. The source that won is kept with the figure.

Pure: no I/O; the adapter reading the counters is adapters/trial_traffic.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    INTER = "inter-node"
    INTRA = "intra-node"


class Source(StrEnum):
    KERNEL = "kernel"
    HOOKS = "hooks"


LOOPBACK = "lo"
# hooks above the kernel's figure by more than this share (and MIN_BYPASS_BYTES) mean traffic
# the kernel did not carry (RDMA, NVLink): the hooks' figure is attributed then
HOOKS_TOLERANCE = 0.05
MIN_BYPASS_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Counters:
    """Bytes one interface received and sent since it was made."""

    rx_bytes: int
    tx_bytes: int


@dataclass(frozen=True, slots=True)
class Flow:
    """Bytes sent and received in one scope."""

    sent: int = 0
    received: int = 0

    def __add__(self, other: Flow) -> Flow:
        return Flow(self.sent + other.sent, self.received + other.received)


@dataclass(frozen=True, slots=True)
class NamespaceSample:
    """One reading of a trial's namespace on a node, as a rank's actor shipped it."""

    namespace: str  # its /run/netns name: the same for every rank of the attempt on the node
    interfaces: tuple[tuple[str, Counters], ...]
    relay_bytes: int = 0  # what the API relay copied in and out (0 on ranks without it)

    def flows(self) -> dict[Scope, Flow]:
        return namespace_flows(dict(self.interfaces), self.relay_bytes)


def parse_proc_net_dev(text: str) -> dict[str, Counters]:
    """The counters of ``/proc/net/dev`` (of the reading thread's network namespace)."""
    found: dict[str, Counters] = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) < 16:
            continue
        found[name.strip()] = Counters(int(fields[0]), int(fields[8]))
    return found


def scope_of(interface: str) -> Scope:
    """``lo`` stays on the node; every other interface of a trial's namespace leaves it."""
    return Scope.INTRA if interface == LOOPBACK else Scope.INTER


def namespace_flows(interfaces: Mapping[str, Counters], relay_bytes: int = 0) -> dict[Scope, Flow]:
    """What the ranks of one namespace sent and received, per scope.

    On ``lo`` every byte is sent and received inside the namespace: the ranks' own traffic is
    what is left after the API relay's bytes (both directions crossed ``lo`` once)."""
    flows: dict[Scope, Flow] = {Scope.INTER: Flow(), Scope.INTRA: Flow()}
    for name, counters in interfaces.items():
        scope = scope_of(name)
        if scope is Scope.INTRA:
            own = max(counters.tx_bytes - relay_bytes, 0)
            flows[scope] += Flow(own, own)
        else:
            flows[scope] += Flow(counters.tx_bytes, counters.rx_bytes)
    return flows


def hook_scopes(
    wire_sent: Mapping[int, int], node_of_rank: Sequence[str]
) -> dict[int, dict[Scope, Flow]]:
    """Per rank, the hooks' wire bytes by scope: a ring sends to the next rank and receives
    from the previous one (the ring algorithms gloo and NCCL use for all-reduce)."""
    world = len(node_of_rank)
    out: dict[int, dict[Scope, Flow]] = defaultdict(lambda: {s: Flow() for s in Scope})
    for rank, sent in wire_sent.items():
        if world <= 1 or not 0 <= rank < world:
            continue
        succ = (rank + 1) % world
        scope = Scope.INTRA if node_of_rank[succ] == node_of_rank[rank] else Scope.INTER
        out[rank][scope] += Flow(sent=sent)
        out[succ][scope] += Flow(received=sent)
    return dict(out)


@dataclass(frozen=True, slots=True)
class Attributed:
    """One node's figure in one scope: the bytes attributed, and the source of each."""

    flow: Flow
    sent_source: Source
    received_source: Source
    kernel: Flow
    hooks: Flow


def _pick(kernel: int, hooks: int) -> tuple[int, Source]:
    bypassed = hooks - kernel
    if bypassed > max(kernel * HOOKS_TOLERANCE, MIN_BYPASS_BYTES):
        return hooks, Source.HOOKS
    return kernel, Source.KERNEL


def reconcile(kernel: Flow | None, hooks: Flow) -> Attributed:
    """The figure of one node and scope (``kernel`` None: the ranks had no namespace)."""
    if kernel is None:
        return Attributed(hooks, Source.HOOKS, Source.HOOKS, Flow(), hooks)
    sent, sent_source = _pick(kernel.sent, hooks.sent)
    received, received_source = _pick(kernel.received, hooks.received)
    return Attributed(Flow(sent, received), sent_source, received_source, kernel, hooks)


@dataclass(frozen=True, slots=True)
class RankTraffic:
    """What one rank of an attempt sent and received in one scope (cumulative)."""

    rank: int
    scope: Scope
    flow: Flow
    source: Source  # the source of the larger direction's figure


def attribute(
    node_of_rank: Sequence[str],
    kernel_by_node: Mapping[str, Mapping[Scope, Flow]],
    hooks_by_rank: Mapping[int, int],
) -> list[RankTraffic]:
    """Per rank and scope, the attempt's traffic so far.

    ``kernel_by_node``: the namespace counters of each node that has them (cumulative);
    ``hooks_by_rank``: each rank's wire bytes as its hooks counted (cumulative). A node's
    reconciled figure is split among its ranks in proportion to their hooks' figures, equally
    where the hooks counted nothing (the kernel counts a namespace, not a process)."""
    hooks = hook_scopes(hooks_by_rank, node_of_rank)
    ranks_of: dict[str, list[int]] = defaultdict(list)
    for rank, node in enumerate(node_of_rank):
        ranks_of[node].append(rank)
    out: list[RankTraffic] = []
    for node, ranks in ranks_of.items():
        for scope in Scope:
            rank_hooks = {r: hooks.get(r, {}).get(scope, Flow()) for r in ranks}
            node_hooks = sum(rank_hooks.values(), Flow())
            kernel = kernel_by_node.get(node, {}).get(scope) if node in kernel_by_node else None
            figure = reconcile(kernel, node_hooks)
            sent = _split(figure.flow.sent, {r: f.sent for r, f in rank_hooks.items()})
            received = _split(figure.flow.received, {r: f.received for r, f in rank_hooks.items()})
            source = (
                figure.sent_source
                if figure.flow.sent >= figure.flow.received
                else (figure.received_source)
            )
            for r in ranks:
                flow = Flow(sent[r], received[r])
                if flow.sent or flow.received:
                    out.append(RankTraffic(r, scope, flow, source))
    return sorted(out, key=lambda t: (t.rank, t.scope.value))


def _split(total: int, weights: Mapping[int, int]) -> dict[int, int]:
    """``total`` in integer parts by ``weights`` (equal parts when they are all 0)."""
    ranks = sorted(weights)
    weight = sum(weights.values())
    shares = {r: (weights[r] if weight else 1) for r in ranks}
    whole = weight if weight else len(ranks)
    parts = {r: total * shares[r] // whole for r in ranks}
    if ranks:
        parts[ranks[0]] += total - sum(parts.values())
    return parts


@dataclass(frozen=True, slots=True)
class TrafficDelta:
    """Bytes accrued since the last write, for one attempt, rank and scope."""

    attempt_id: int
    rank: int
    scope: Scope
    sent: int
    received: int
    source: Source


def deltas(
    attempt_id: int,
    now: Iterable[RankTraffic],
    written: Mapping[tuple[int, str], Flow],
) -> list[TrafficDelta]:
    """What grew since ``written`` ((rank, scope) -> the cumulative figure last written).
    A figure that went down (a rank restarted its counters) starts over from zero."""
    out = []
    for t in now:
        before = written.get((t.rank, t.scope.value), Flow())
        sent = t.flow.sent - before.sent if t.flow.sent >= before.sent else t.flow.sent
        received = (
            t.flow.received - before.received
            if t.flow.received >= before.received
            else t.flow.received
        )
        if sent or received:
            out.append(TrafficDelta(attempt_id, t.rank, t.scope, sent, received, t.source))
    return out
