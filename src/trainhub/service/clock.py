"""Time as a port: services ask an injected clock, tests step a fake one."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def system_clock() -> float:
    return time.time()
