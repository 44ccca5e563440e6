"""Traffic figures from namespace counters and hook counts (core/traffic.py, ADR 0045)."""

from __future__ import annotations

from trainhub.core.traffic import (
    Counters,
    Flow,
    NamespaceSample,
    Scope,
    Source,
    attribute,
    deltas,
    hook_scopes,
    parse_proc_net_dev,
    reconcile,
)

HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
)
PROC_NET_DEV = (
    HEADER + "    lo:  5000      10    0    0    0     0          0         0     5000      10    0"
    "    0    0     0       0          0\n"
    + "trial0: 1200000    900    0    0    0     0          0         0  3400000    2000    0"
    "    0    0     0       0          0\n"
)


def test_proc_net_dev_is_read_per_interface() -> None:
    found = parse_proc_net_dev(PROC_NET_DEV)
    assert found == {"lo": Counters(5000, 5000), "trial0": Counters(1_200_000, 3_400_000)}


def test_loopback_is_intra_node_less_the_relay_and_the_tunnel_is_inter_node() -> None:
    sample = NamespaceSample("th-x", tuple(parse_proc_net_dev(PROC_NET_DEV).items()), 1000)
    flows = sample.flows()
    assert flows[Scope.INTRA] == Flow(4000, 4000)
    assert flows[Scope.INTER] == Flow(3_400_000, 1_200_000)


def test_a_ring_sends_to_the_next_rank_and_its_node_says_the_scope() -> None:
    # ranks 0, 1 on node a; 2, 3 on node b: 1 -> 2 and 3 -> 0 cross nodes
    scopes = hook_scopes(dict.fromkeys(range(4), 100), ["a", "a", "b", "b"])
    assert scopes[0][Scope.INTRA] == Flow(100, 0)
    assert scopes[0][Scope.INTER] == Flow(0, 100)
    assert scopes[1][Scope.INTER] == Flow(100, 0)
    assert scopes[2][Scope.INTER] == Flow(0, 100)


def test_the_kernel_is_the_truth_unless_the_hooks_saw_more_than_it_carried() -> None:
    # within 5%: the kernel (it also saw headers, the store, retransmissions)
    agreed = reconcile(Flow(1_050_000_000, 1_000_000_000), Flow(1_000_000_000, 1_000_000_000))
    assert agreed.flow == Flow(1_050_000_000, 1_000_000_000)
    assert agreed.sent_source is Source.KERNEL
    # NCCL over RDMA: the kernel saw almost nothing
    bypassed = reconcile(Flow(2_000_000, 2_000_000), Flow(8_000_000_000, 8_000_000_000))
    assert bypassed.flow == Flow(8_000_000_000, 8_000_000_000)
    assert bypassed.sent_source is Source.HOOKS
    # no namespace at all: the hooks
    assert reconcile(None, Flow(5, 5)).sent_source is Source.HOOKS


def test_a_node_s_figure_is_split_among_its_ranks_by_their_hooks() -> None:
    kernel = {"a": {Scope.INTER: Flow(3000, 3000), Scope.INTRA: Flow()}}
    figures = attribute(["a", "a", "b"], kernel, {0: 0, 1: 2000, 2: 1000})
    # on node a, rank 1 sent across nodes (to rank 2), rank 0 sent within the node
    inter = {f.rank: f.flow for f in figures if f.scope is Scope.INTER}
    assert inter[1].sent == 3000  # node a's counters, all of it rank 1's
    assert inter[2].sent == 1000  # node b had no counters: its hooks (to rank 0 on a)


def test_what_grew_since_the_last_write_and_a_restarted_counter() -> None:
    figures = attribute(["a"], {"a": {Scope.INTRA: Flow(500, 500)}}, {})
    assert [
        (d.sent, d.received) for d in deltas(7, figures, {(0, "intra-node"): Flow(200, 200)})
    ] == [(300, 300)]
    assert [
        (d.sent, d.received) for d in deltas(7, figures, {(0, "intra-node"): Flow(900, 900)})
    ] == [(500, 500)]
