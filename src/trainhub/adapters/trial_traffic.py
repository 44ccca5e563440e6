"""Reads the byte counters of a trial's network namespace, and the hooks' counts a rank left.

The kernel keeps per-interface counters in each network namespace; ``/proc/thread-self/net/dev``
shows those of the reading thread's namespace, so a short-lived thread joins the trial's
namespace (``setns`` on the descriptor the rank's :class:`Containment` keeps open) and reads
them. The namespace lives as long as a descriptor or a process holds it, so the counters are
still there after the rank's process ended, until the actor's cleanup.

The runtime's communication hooks write their cumulative counts to a small JSON file in the
attempt's spool folder (:data:`HOOKS_FILE`, one per rank); the rank actor reads it with the
counters and ships both in its status (docs/adr/0045).

This module is imported inside Ray worker processes: standard library only (and pure core).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from trainhub.adapters import trial_network
from trainhub.core.traffic import Counters, parse_proc_net_dev

# in the attempt's spool folder: the same name as trainhub.runtime.protocol.COMM_COUNTS_FILE
HOOKS_FILE = "comm-rank{rank}.json"


def read_namespace(fd: int) -> dict[str, Counters]:
    """The interface counters of the namespace ``fd`` (an open ``/run/netns`` name)."""
    found: list[dict[str, Counters]] = []
    failed: list[BaseException] = []

    def enter_and_read() -> None:
        try:
            trial_network.join(fd)  # this thread only; it ends right after
            found.append(parse_proc_net_dev(Path("/proc/thread-self/net/dev").read_text()))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=enter_and_read, name="trial-traffic")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return found[0]


def read_hooks(spool: Path, rank: int) -> int | None:
    """The wire bytes rank ``rank``'s hooks counted so far (None: it wrote nothing)."""
    try:
        data = json.loads((spool / HOOKS_FILE.format(rank=rank)).read_text())
        return int(data["wire_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
