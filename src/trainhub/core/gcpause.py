"""Pausing Python's cyclic garbage collector around one scheduling decision.

A decision allocates many short-lived tuples; with the collector on, every few thousand
allocations it runs, and now and then a full collection walks every object the control plane
holds (the queue's and the running trials' views: hundreds of thousands of objects with 5,000
queued trials). That put tens of milliseconds into the slowest decisions. Paused, the garbage
of a decision is collected after it, between ticks, where nobody waits on it. The control loop,
the simulator and the decision-latency benchmark use this one helper.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's state is restored after it
    (nesting is fine: an inner block leaves a paused collector paused)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
