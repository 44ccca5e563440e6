"""Rank 0's startup marks: when its interpreter ran, ``init`` was called, the process group
came up and the first optimizer step ended; sent once to the control plane, which turns them
into the attempt's startup phases (``trainhub show``, the trial page).

The first step is seen through torch's global optimizer-step hook (every optimizer, the user's
own included), removed after it fired once. Sending happens on a daemon thread and never delays
training; :meth:`StartupMarks.close` waits for it briefly when the script ends.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from trainhub.runtime import protocol

logger = logging.getLogger("trainhub.runtime")
_SEND_TIMEOUT_S = 5.0


def process_started_at() -> float | None:
    """Wall-clock time this process was started (Linux ``/proc``), or None elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        with open("/proc/stat", encoding="ascii") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith("btime "))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class StartupMarks:
    """The marks of one rank; only a managed rank 0 sends them.

    Args:
        attempt: the attempt number (``TRAINHUB_ATTEMPT``).
        send: posts one :class:`~trainhub.runtime.protocol.StartupReport`; None: keep only.
        launched: the executor's marks (``TRAINHUB_STARTUP_MARKS``, JSON), if any.
    """

    def __init__(
        self,
        attempt: int,
        send: Callable[[protocol.StartupReport], None] | None,
        launched: str | None,
    ) -> None:
        self.attempt = attempt
        self._send = send
        self.marks: dict[str, float] = {}
        self.warm = False
        if launched:
            self._merge_launch_marks(launched)
        process_at = process_started_at()
        if process_at is not None and "process_at" not in self.marks:
            self.marks["process_at"] = process_at
        self.marks["init_at"] = time.time()
        self._hook: Any = None
        self._thread: threading.Thread | None = None

    def _merge_launch_marks(self, launched: str) -> None:
        try:
            parsed = json.loads(launched)
        except json.JSONDecodeError:
            return
        if not isinstance(parsed, dict):
            return
        for name, value in parsed.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.marks[str(name)] = float(value)
        self.warm = parsed.get("warm") is True

    def process_group_ready(self) -> None:
        """Mark the process group up, then wait for the first optimizer step."""
        self.marks["process_group_at"] = time.time()
        if self._send is None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._first_step)

    def _first_step(self, *_: Any) -> None:
        if self._hook is None:
            return
        self._hook.remove()
        self._hook = None
        self.marks["first_step_at"] = time.time()
        self._thread = threading.Thread(target=self._deliver, name="trainhub-startup", daemon=True)
        self._thread.start()

    def _deliver(self) -> None:
        assert self._send is not None
        report: protocol.StartupReport = {
            "attempt": self.attempt,
            "marks": dict(self.marks),
            "warm": self.warm,
        }
        try:
            self._send(report)
        except Exception as exc:  # a report about timing must never fail the training
            logger.info("trainhub: startup marks not delivered: %s", exc)

    def close(self) -> None:
        """Stop waiting for a first step; give a report being sent a moment to arrive."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._thread is not None:
            self._thread.join(_SEND_TIMEOUT_S)
