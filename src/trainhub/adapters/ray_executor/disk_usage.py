"""What a trial wrote on a node: the bytes of its rank folders (home, code), its attempt's
spool and its checkpoint folder, measured by the rank actor on a thread of its own.

The API counts the checkpoints it receives; a trial can also write straight into these
folders (issue 24: 2 GiB into the checkpoint folder, 2 GiB into its home, never counted).
Each rank measures the folders it sees every ``interval_s`` seconds and answers the latest
numbers with its status; the control loop adds them up per trial (a folder shared by ranks
counted once, by its path) and holds them against the trial's and the tenant's storage quotas.

A walk stops after ``max_entries`` files (a trial cannot make the measurement itself costly);
the count then is a lower bound and says so. Standard library only: imported by Ray workers.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Mapping


def measure(root: str, max_entries: int) -> tuple[int, bool]:
    """Bytes allocated under ``root`` (hard links once, symlinks not followed) and whether the
    walk saw everything (False: it stopped after ``max_entries`` entries)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [root]
    entries = 0
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    entries += 1
                    if entries > max_entries:
                        return total, False
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
                    elif stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                        if info.st_nlink > 1:
                            seen.add((info.st_dev, info.st_ino))
                        # allocated blocks: a sparse 2 GiB file costs what it holds; the
                        # larger of the two, so a file of zeros is not free either
                        total += max(info.st_size, info.st_blocks * 512)
        except OSError:
            continue
    return total, True


class DiskMeter:
    """Measures ``paths`` every ``interval_s`` on a daemon thread; :meth:`latest` answers."""

    def __init__(self, paths: Iterable[str], interval_s: float, max_entries: int) -> None:
        self._paths = list(dict.fromkeys(paths))
        self._interval_s = interval_s
        self._max_entries = max_entries
        self._latest: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainhub-disk", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.measure_now()
            self._wake.wait(self._interval_s)
            self._wake.clear()

    def wake(self) -> None:
        """Measure again soon, on the meter's thread (never on the caller's)."""
        self._wake.set()

    def measure_now(self) -> dict[str, int]:
        found = {}
        for path in self._paths:
            if os.path.isdir(path):
                found[path] = measure(path, self._max_entries)[0]
        with self._lock:
            self._latest = found
        return dict(found)

    def latest(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._latest)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
