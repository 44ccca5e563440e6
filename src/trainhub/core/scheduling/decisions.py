"""What a policy returns. The service (or the simulator) carries the decisions out."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from trainhub.core.scheduling.snapshot import QueuedTrial


@dataclass(frozen=True, slots=True)
class Start:
    """Start every rank of a trial now; ``placement[r]`` is the node of rank r."""

    trial_id: int
    placement: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pending:
    """Leave a queued trial waiting; ``reason`` is shown to its user."""

    trial_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Ask a running trial to checkpoint, exit and go back to the queue."""

    trial_id: int
    reason: str


Decision = Start | Pending | Preempt
Reason = str | Callable[["QueuedTrial"], str]


class DecisionList(Sequence[Decision]):
    """The decisions of one pass: starts, preemptions, then one ``Pending`` per waiting trial.

    On a long queue most trials wait for the same reason as the trial ahead of them in their
    group, so a policy hands those over as ``(trials, reason)`` pairs and the ``Pending`` objects
    are made the first time the list is read. Carrying out a pass needs only ``starts`` and
    ``preempts``; the simulator never reads the rest.

    ``wake_at`` is the earliest time the policy would decide differently although nothing else
    happened (a victim passes its minimum run time, a running trial crosses a queue threshold):
    an event-driven caller runs a pass then; a caller that ticks anyway may ignore it.
    """

    __slots__ = ("_lazy", "_made", "_pending", "preempts", "starts", "wake_at")

    def __init__(
        self,
        starts: Sequence[Start] = (),
        preempts: Sequence[Preempt] = (),
        pending: Sequence[Pending] = (),
        lazy: Sequence[tuple[Sequence[QueuedTrial], int, Reason]] = (),
        wake_at: float | None = None,
    ) -> None:
        self.starts = tuple(starts)
        self.preempts = tuple(preempts)
        self._pending = tuple(pending)
        self._lazy = tuple(lazy)
        self._made: tuple[Decision, ...] | None = None
        self.wake_at = wake_at

    def _all(self) -> tuple[Decision, ...]:
        if self._made is None:
            made: list[Decision] = [*self.starts, *self.preempts, *self._pending]
            for trials, start, reason in self._lazy:
                if isinstance(reason, str):
                    made.extend(Pending(t.trial_id, reason) for t in trials[start:])
                else:
                    made.extend(Pending(t.trial_id, reason(t)) for t in trials[start:])
            self._made = tuple(made)
        return self._made

    @property
    def pending(self) -> tuple[Pending, ...]:
        return tuple(d for d in self._all() if isinstance(d, Pending))

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[Decision]:
        return iter(self._all())

    @overload
    def __getitem__(self, index: int) -> Decision: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Decision]: ...
    def __getitem__(self, index: int | slice) -> Decision | Sequence[Decision]:
        return self._all()[index]

    def __repr__(self) -> str:
        return (
            f"DecisionList({len(self.starts)} starts, {len(self.preempts)} preempts, "
            f"wake_at={self.wake_at})"
        )


def split_decisions(
    decisions: Sequence[Decision],
) -> tuple[tuple[Start, ...], tuple[Preempt, ...], float | None]:
    """Starts, preemptions and wake-up time of any policy's answer, without making pendings."""
    if isinstance(decisions, DecisionList):
        return decisions.starts, decisions.preempts, decisions.wake_at
    starts = tuple(d for d in decisions if isinstance(d, Start))
    preempts = tuple(d for d in decisions if isinstance(d, Preempt))
    return starts, preempts, None
