"""Why a trial waits, in words its user understands; computed only when someone reads them.

Every pending trial carries a reason. Most of them are read rarely (the simulator never reads
them), so a pass records the starts it makes and a :class:`ReasonBook` turns "busy" and
"never fits" into text against the nodes as they are after the pass, once per request shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.placement import FreeSummary, busy_reason, never_reason
from trainhub.core.scheduling.queue import Shape, shape_of
from trainhub.core.scheduling.snapshot import QueuedTrial


class ReasonBook:
    """Reasons against the nodes of a snapshot after the starts of one pass."""

    def __init__(self, nodes: tuple[Node, ...], pool: NodePool | None = None) -> None:
        self._nodes = nodes
        # answers "does it fit the empty cluster" from a memo (shared across passes)
        self._pool = pool
        self._used: dict[str, tuple[int, float, float]] = {}
        self._final: tuple[Node, ...] | None = None
        self._busy: dict[Shape, str] = {}
        self._summary: FreeSummary | None = None
        self._never: dict[Shape, str | None] = {}

    def started(self, request: ResourceRequest, ranks: tuple[str, ...]) -> None:
        for node in ranks:
            gpus, cpus, memory = self._used.get(node, (0, 0.0, 0.0))
            self._used[node] = (
                gpus + request.gpus_per_worker,
                cpus + request.cpus_per_worker,
                memory + request.memory_gb_per_worker,
            )
        self._final = None
        self._summary = None

    def final_nodes(self) -> tuple[Node, ...]:
        if self._final is None:
            used = self._used
            self._final = tuple(
                replace(
                    n,
                    free_gpus=n.free_gpus - used[n.node_id][0],
                    free_cpus=n.free_cpus - used[n.node_id][1],
                    free_memory_gb=n.free_memory_gb - used[n.node_id][2],
                )
                if n.node_id in used
                else n
                for n in self._nodes
            )
        return self._final

    def busy(self, trial: QueuedTrial) -> str:
        """'needs 16 GPUs on one node; largest free is 8' (capacity after this pass)."""
        shape = shape_of(trial.request)
        text = self._busy.get(shape)
        if text is None:
            text = self._busy_text(trial.request)
            self._busy[shape] = text
        return text

    def _busy_text(self, request: ResourceRequest) -> str:
        if self._summary is None:
            self._summary = FreeSummary.of(self.final_nodes())
        return busy_reason(request, self.final_nodes(), self._summary)

    def never_text(self, trial: QueuedTrial) -> str | None:
        """'can never run: ...' for a request the empty cluster cannot hold, else None."""
        return self._never_of(trial.request, shape_of(trial.request))

    def _never_of(self, request: ResourceRequest, shape: Shape) -> str | None:
        if shape not in self._never:
            if self._pool is not None and self._pool.fits_empty(request, shape):
                self._never[shape] = None
            else:
                self._never[shape] = never_reason(request, self._nodes)
        return self._never[shape]

    def never(self, trial: QueuedTrial) -> str:
        return self.never_text(trial) or "can never run on this cluster"

    def waiting(self, trial: QueuedTrial) -> str:
        """The never-fits reason if there is one, else the busy one."""
        return self.never_text(trial) or self.busy(trial)

    def of_group(
        self, kind: str, request: ResourceRequest, shape: Shape
    ) -> Callable[[QueuedTrial], str]:
        """``busy``, ``never`` or ``waiting`` for every trial of one request shape, computed
        once for the group instead of once per trial."""
        made: list[str] = []

        def reason(_: QueuedTrial) -> str:
            if not made:
                if kind == "never":
                    made.append(self._never_by_shape(request, shape))
                elif kind == "busy":
                    made.append(self._busy_by_shape(request, shape))
                else:
                    text = self._never_by_shape(request, shape, fallback=False)
                    made.append(text or self._busy_by_shape(request, shape))
            return made[0]

        return reason

    def unless_never(
        self, request: ResourceRequest, shape: Shape, text: str
    ) -> Callable[[QueuedTrial], str]:
        """``text`` for every trial of one request shape, or why that shape can never run."""
        made: list[str] = []

        def reason(_: QueuedTrial) -> str:
            if not made:
                made.append(self._never_of(request, shape) or text)
            return made[0]

        return reason

    def _busy_by_shape(self, request: ResourceRequest, shape: Shape) -> str:
        text = self._busy.get(shape)
        if text is None:
            text = self._busy_text(request)
            self._busy[shape] = text
        return text

    def _never_by_shape(self, request: ResourceRequest, shape: Shape, fallback: bool = True) -> str:
        text = self._never_of(request, shape)
        if text is None and fallback:
            return "can never run on this cluster"
        return text or ""

    def prefixed(self, prefix: str) -> Callable[[QueuedTrial], str]:
        """A busy reason with ``prefix`` before it ('behind trial 12 (reserved); ...')."""
        return lambda trial: f"{prefix}; {self.busy(trial)}"


def limit_reason(limit: int, used: int, unit: str = "GPUs") -> str:
    """'tenant quota of 8 GPUs in use (8 running)'; ``unit`` is CPUs for trials without GPUs,
    whose slots are CPU cores."""
    return f"tenant quota of {limit} {unit} in use ({used} running)"


def behind_reason(trial_id: int) -> str:
    return f"behind trial {trial_id} (reserved)"
