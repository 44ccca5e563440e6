"""Polling the server at a steady pace: the one loop behind every "follow" and "wait".

The API has no push channel, so following a trial or its logs means asking again every few
seconds. :func:`polls` is the pacing of that loop and nothing else: the caller fetches, decides
whether it is done and breaks out; the helper waits between rounds and gives up at a deadline.
Both ways of waiting are injected (``sleep`` and ``clock``), so a test steps the loop one round
at a time with a fake clock instead of sleeping.

Example::

    for _ in polls(2.0, timeout_s=60):
        trial = client.get_trial(7)
        if trial["state"] in TERMINAL_STATES:
            break
    else:
        raise TimeoutError("trial 7 is still running")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator


def polls(
    interval_s: float,
    *,
    timeout_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[int]:
    """Yield the number of each polling round (0, 1, 2, ...), paced ``interval_s`` apart.

    The first round comes at once. Each later one comes after ``sleep(interval_s)``, which runs
    only when the caller asks for the next round: breaking out of the loop once done never
    waits. The interval is counted from the end of a round, not its start, so a slow server
    is asked less often rather than at once again.

    Args:
        interval_s: seconds to wait between the end of one round and the start of the next.
        timeout_s: stop (the iteration just ends) when a round ends after this many seconds
            from the call; None: poll until the caller breaks out.
        sleep: how to wait (tests pass a fake that moves their clock or the server on).
        clock: monotonic seconds, read for the deadline only.
    """
    deadline = None if timeout_s is None else clock() + timeout_s
    number = 0
    while True:
        yield number
        if deadline is not None and clock() > deadline:
            return
        sleep(interval_s)
        number += 1
