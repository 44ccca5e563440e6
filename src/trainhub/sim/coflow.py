"""Two or more data-parallel gangs whose all-reduces cross one shared link (a rack uplink),
as a fluid model: the co-flow experiment of docs/adr/0046.

Each gang repeats a step: ``compute_s`` of computation (with a little jitter), then an
all-reduce that must move ``volume_gb`` across the shared link. While ``n`` gangs communicate
at once, each gets ``1/n`` of the link (max-min fair, as TCP/RoCE flows of equal weight
roughly do); a gang alone gets all of it. A *staggered* schedule starts gang ``i``'s first
step ``i * period / n`` late, where ``period`` is one step alone, and then holds each gang's
communication until its turn comes round: a co-flow scheduler's gate, which costs the gang
a wait when its compute ran short but keeps the link to one gang at a time.

Pure and deterministic for a seed (``random.Random``): no clock, no I/O.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class CoflowResult:
    step_s: tuple[float, ...]  # each gang's mean step time
    alone_s: float  # one step of a gang with the link to itself
    overlap_share: float  # of the time anyone communicated, the share two or more did

    @property
    def slowdown(self) -> float:
        """The mean step time over the step alone, averaged over the gangs."""
        return sum(self.step_s) / len(self.step_s) / self.alone_s


def simulate_coflow(
    gangs: int = 2,
    steps: int = 200,
    compute_s: float = 0.060,
    volume_gb: float = 2.0,
    link_gbps: float = 400.0,
    jitter: float = 0.02,
    staggered: bool = False,
    seed: int = 0,
) -> CoflowResult:
    """Run ``gangs`` gangs for ``steps`` steps each; their mean step times."""
    rng = random.Random(seed)
    comm_alone = volume_gb * 8 / link_gbps  # seconds to move the volume with the whole link
    period = compute_s + comm_alone
    # per gang: phase ("compute" until t_ready, then "comm" with bytes left), steps done
    ready = [(i * period / gangs if staggered else 0.0) + _draw(rng, compute_s, jitter)
             for i in range(gangs)]  # fmt: skip
    left = [math.inf] * gangs  # gigabits left to send; inf: computing
    done = [0] * gangs
    finished_at = [0.0] * gangs
    # the staggered gate: gang i may start its k-th all-reduce at i*period/n + compute + k*period
    slot = [i * period / gangs + compute_s for i in range(gangs)] if staggered else [0.0] * gangs
    now = 0.0
    busy = overlap = 0.0
    while min(done) < steps:
        active = [i for i in range(gangs) if left[i] != math.inf and done[i] < steps]
        starting = [i for i in range(gangs) if left[i] == math.inf and done[i] < steps]
        # the next start of an all-reduce: compute done and (staggered) the gang's slot come
        next_start = min((max(ready[i], slot[i] + done[i] * period) if staggered else ready[i])
                         for i in starting) if starting else math.inf  # fmt: skip
        share = link_gbps / len(active) if active else 0.0
        next_end = min((left[i] / share for i in active), default=math.inf)
        step = min(next_start - now, next_end)
        if step == math.inf:
            break
        if active:
            busy += step
            if len(active) > 1:
                overlap += step
            for i in active:
                left[i] -= share * step
        now += step
        for i in active:
            if left[i] <= 1e-9:
                left[i] = math.inf
                done[i] += 1
                finished_at[i] = now
                ready[i] = now + _draw(rng, compute_s, jitter)
        for i in starting:
            begin = max(ready[i], slot[i] + done[i] * period) if staggered else ready[i]
            if begin <= now + 1e-12:
                left[i] = volume_gb * 8
    first = [i * period / gangs if staggered else 0.0 for i in range(gangs)]
    means = tuple((finished_at[i] - first[i]) / steps for i in range(gangs))
    return CoflowResult(means, period, overlap / busy if busy else 0.0)


def _draw(rng: random.Random, mean: float, jitter: float) -> float:
    return max(0.0, rng.gauss(mean, mean * jitter))
