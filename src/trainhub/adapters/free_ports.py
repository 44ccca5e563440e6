"""Free TCP ports for servers started later, chosen where no outgoing connection lands.

A port found free by binding port 0 comes from the kernel's ephemeral range, the range every
outgoing connection of the machine also takes its local port from: between choosing it and a
server binding it, a client on the node (or of the same server: SeaweedFS's volume
connecting to its master) may hold it, and the server dies with "address already in use" (seen
in the tests: SeaweedFS's filer gRPC port). These ports are picked below the ephemeral range
and above Ray's worker ports (10002-19999 by default), at random, and checked free by binding:
rank 0's torch.distributed store (``rank_worker``), the local Ray head's ports, the tests'
servers. Standard library only: forked gloo ranks import it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20_000  # above Ray's default worker ports
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port no process listens on now on ``host`` ("" for every interface), outside the
    ephemeral range where there is room."""
    top = _ephemeral_start()
    if top - LOWEST >= 1_000:
        for _ in range(100):
            port = random.randrange(LOWEST, top)
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:  # a machine whose ephemeral range leaves no room below
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
