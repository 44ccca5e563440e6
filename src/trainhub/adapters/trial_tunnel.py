"""A tunnel of its own between one trial's network namespaces on different nodes.

A trial on one node has a namespace with loopback and the API relay only (trial_network.py).
A trial placed on several nodes gets one more interface in its namespace on each of them:
``trial0``, a VXLAN device with a network id of the attempt's own (:func:`vxlan_id`) whose
frames travel between the trial's nodes in UDP on :data:`TUNNEL_PORT`, sent to the trial's
other nodes only (one forwarding entry per peer node, nothing learned from elsewhere: the
kernel delivers a frame to the device of its network id only). On it, the trial's node ``k``
(in the order of the trial's first rank on each) has address ``100.64.0.(k+1)/24``; the ranks
rendezvous there (``MASTER_ADDR`` is rank 0's node's address, ``GLOO_SOCKET_IFNAME=trial0``).

So a trial's ranks reach each other's ports across nodes and nothing else: the namespace has
no route to the node, the cluster or another trial (its addresses exist inside the tunnel
only; every trial has the same ones, each in its own namespaces), and the node forwards
nothing (no ``ip_forward``, no routes, no NAT). What remains open is the tunnel's UDP port on
each node: an ``nftables`` rule (table ``inet trainhub``) accepts it from the cluster's nodes
only, so a machine outside the cluster cannot put frames into a trial's tunnel. Without
``nft`` on a node, trials that span nodes keep the node's network (the server says so).
docs/adr/0030 says why this and not routed veth pairs.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainhub.adapters.trial_network import TrialNetwork

TUNNEL_PORT = 47880  # the same on every node of a cluster (like Ray's ports)
SUBNET = ipaddress.ip_network("100.64.0.0/24")  # inside each trial's namespaces only
INTERFACE = "trial0"
TABLE = "trainhub"
_LOCK = Path("/run/trainhub/nftables.lock")


class TunnelUnavailable(RuntimeError):
    """No tunnel can be made here (no root, no ``ip``/``bridge``/``nft``, no VXLAN)."""


@dataclass(frozen=True, slots=True)
class TunnelPlan:
    """One node's end of an attempt's tunnel."""

    vxlan_id: int
    node_index: int  # this node's place among the trial's nodes
    local_ip: str  # this node's address on the cluster's network (the tunnel's outer source)
    peer_ips: tuple[str, ...]  # the trial's other nodes

    @property
    def address(self) -> str:
        return address_of(self.node_index)


def plan(attempt_id: str, node_ips: Sequence[str], local_ip: str) -> TunnelPlan:
    """This node's end of the tunnel of ``attempt_id`` whose nodes are ``node_ips``, in order."""
    if local_ip not in node_ips:
        raise TunnelUnavailable(f"this node ({local_ip}) is not one of the trial's {node_ips}")
    if len(node_ips) > SUBNET.num_addresses - 2:
        raise TunnelUnavailable(f"a trial's tunnel joins at most 254 nodes, not {len(node_ips)}")
    peers = tuple(ip for ip in node_ips if ip != local_ip)
    return TunnelPlan(vxlan_id(attempt_id), list(node_ips).index(local_ip), local_ip, peers)


def address_of(node_index: int) -> str:
    """The tunnel address of the trial's node ``node_index`` (the same in every trial)."""
    return str(SUBNET.network_address + node_index + 1)


def vxlan_id(attempt_id: str) -> int:
    """The attempt's VXLAN network id: 24 bits of its hash (a clash on a node is refused)."""
    digest = hashlib.sha256(attempt_id.encode()).digest()
    return int.from_bytes(digest[:3], "big") % ((1 << 24) - 1) + 1


def tunnel_problem() -> str | None:
    """Why a trial's tunnel cannot be made on this node (None when it can)."""
    if os.geteuid() != 0:
        return "tunnels between a trial's nodes need a root node agent"
    for tool in ("ip", "bridge", "nft"):
        if _tool(tool) is None:
            package = "nftables" if tool == "nft" else "iproute2"
            return f"no `{tool}` on this node (apt-get install {package})"
    listed = _run(["nft", "list", "tables"], check=False)
    if listed.returncode != 0:
        return f"nft cannot read the rules here: {listed.stderr.strip()}"
    probe = f"thxprobe{os.getpid() % 100000}"
    made = _run(
        ["ip", "link", "add", probe, "type", "vxlan", "id", "1", "dstport", str(TUNNEL_PORT),
         "local", "127.0.0.1"],
        check=False,
    )  # fmt: skip
    if made.returncode != 0:
        return f"no VXLAN device can be made here: {made.stderr.strip()}"
    _run(["ip", "link", "del", probe], check=False)
    return None


def add_tunnel(network: TrialNetwork, tunnel: TunnelPlan) -> None:
    """Give the (new) namespace its end of the tunnel: ``trial0``, its address, its peers."""
    accept_tunnel_from(tunnel.peer_ips)
    # made in the node's namespace (its UDP socket stays there), then moved into the trial's
    temporary = "thx" + hashlib.sha256(network.name.encode()).hexdigest()[:12]
    made = _run(
        ["ip", "link", "add", temporary, "type", "vxlan", "id", str(tunnel.vxlan_id),
         "dstport", str(TUNNEL_PORT), "local", tunnel.local_ip],
        check=False,
    )  # fmt: skip
    if made.returncode != 0:
        raise TunnelUnavailable(
            f"cannot make the trial's tunnel (VXLAN id {tunnel.vxlan_id}) on this node: "
            f"{made.stderr.strip()} (another attempt's id on this node clashes: it restarts "
            "with another)"
        )
    try:
        _run(["ip", "link", "set", temporary, "netns", network.name])
    except TunnelUnavailable:
        _run(["ip", "link", "del", temporary], check=False)
        raise
    inside = ["ip", "-n", network.name]
    _run([*inside, "link", "set", temporary, "name", INTERFACE])
    _run([*inside, "address", "add", f"{tunnel.address}/{SUBNET.prefixlen}", "dev", INTERFACE])
    _run([*inside, "link", "set", INTERFACE, "up"])
    for peer in tunnel.peer_ips:  # frames for unknown hosts (ARP) go to every peer, no other
        _run(["bridge", "-n", network.name, "fdb", "append", "00:00:00:00:00:00", "dev",
              INTERFACE, "dst", peer])  # fmt: skip


def accept_tunnel_from(nodes: Sequence[str]) -> None:
    """The node accepts tunnel packets from ``nodes`` (added to a set) and from no one else."""
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _run(["nft", "list", "chain", "inet", TABLE, "tunnel"], check=False).returncode:
            rules = (
                f"table inet {TABLE} {{\n"
                "  set tunnel_peers { type ipv4_addr; }\n"
                "  chain tunnel {\n"
                "    type filter hook input priority filter; policy accept;\n"
                f"    udp dport {TUNNEL_PORT} ip saddr != @tunnel_peers drop\n"
                "  }\n"
                "}\n"
            )
            _run(["nft", "-f", "-"], input_text=rules)
        if nodes:
            elements = ", ".join(nodes)
            _run(["nft", "add", "element", "inet", TABLE, "tunnel_peers", f"{{ {elements} }}"])


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(
    argv: list[str], *, check: bool = True, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    tool = _tool(argv[0])
    if tool is None:
        raise TunnelUnavailable(f"no `{argv[0]}` on this node")
    done = subprocess.run(
        [tool, *argv[1:]],
        input=input_text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if check and done.returncode != 0:
        raise TunnelUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done
