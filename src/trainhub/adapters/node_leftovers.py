"""What a rank actor made on its node (cgroups, network namespace names), found again if it died.

A rank actor removes its cgroup and its attempt's network namespace name when it is cleaned
up. An actor killed outright (SIGKILL, the node agent's or Ray's crash) cannot: its rank's
processes die with it (PR_SET_PDEATHSIG), but the cgroup folders and the /run/netns name stay.
So every such thing is *held*: a file in :data:`HELD_DIR` names it (what to remove, as JSON)
and the actors that use it keep a shared ``flock`` on that file for as long as they live. The
kernel drops a lock with the last descriptor of its process, however the process ends, so a
file whose lock :func:`sweep` can take exclusively names something nobody uses any more: the
sweep removes it, then the file. Rank starts sweep their node, and so does each node's agent
every :data:`SWEEP_INTERVAL_S` (adapters/monitor/agent.py).

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import tempfile
import time
from pathlib import Path

from trainhub.adapters import cgroups, trial_network

# root's (every control plane of the node); a node agent that is not root keeps its own
HELD_DIR = (
    Path("/run/trainhub/held")
    if os.geteuid() == 0
    else Path(tempfile.gettempdir()) / f"trainhub-held-{os.geteuid()}"
)
SWEEP_INTERVAL_S = 60.0


class Hold:
    """A shared lock on the file that names one thing this process uses (released on close)."""

    def __init__(self, name: str, what: dict[str, object]) -> None:
        HELD_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = HELD_DIR / re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:240]
        content = json.dumps(what, sort_keys=True).encode()
        while True:  # a sweep may unlink the file between our open and our lock: open anew
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.pwrite(fd, content, 0)  # every holder writes the same bytes
        self._fd: int | None = fd

    def last(self) -> bool:
        """Whether no other process holds it any more (then this one holds it alone)."""
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def release(self, *, removed: bool = False) -> None:
        """Let go; ``removed``: the thing is gone (after :meth:`last`), so its file goes too."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if removed:
                self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def hold_cgroup(group: cgroups.BaseRankCgroup, name: str) -> Hold:
    return Hold(f"cgroup-{name}", {"cgroup": [str(p) for p in group.folders()]})


def hold_network(network: trial_network.TrialNetwork) -> Hold:
    return Hold(f"netns-{network.name}", {"netns": network.name})


def sweep(held_dir: Path | None = None) -> list[str]:
    """Remove what no living process holds; the names of what was removed."""
    folder = held_dir or HELD_DIR
    removed: list[str] = []
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue  # in use
                raise
            what = _read(fd)
            if _remove(what):
                path.unlink(missing_ok=True)
                removed.append(path.name)
        finally:
            os.close(fd)
    return removed


def _read(fd: int) -> dict[str, object]:
    data = os.pread(fd, 1 << 16, 0)
    try:
        what = json.loads(data.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return what if isinstance(what, dict) else {}


def _remove(what: dict[str, object]) -> bool:
    """Remove one leftover; False when it is still there (tried again at the next sweep)."""
    folders = what.get("cgroup")
    if isinstance(folders, list):
        leftover = cgroups.LeftoverCgroup([Path(str(f)) for f in folders])
        leftover.remove(timeout_s=2.0)
        return not any(Path(str(f)).exists() for f in folders)
    name = what.get("netns")
    if isinstance(name, str) and name.startswith("th-"):
        network = trial_network.TrialNetwork(name)
        network.remove()
        return not network.path.exists()
    return True  # nothing this version knows: the file alone goes


def sweep_quietly(last: list[float], interval_s: float = SWEEP_INTERVAL_S) -> None:
    """:func:`sweep` at most every ``interval_s`` (``last`` keeps the time); never raises."""
    now = time.monotonic()
    if last and now - last[0] < interval_s:
        return
    last[:] = [now]
    with contextlib.suppress(OSError):
        sweep()
