"""What the control plane observes of one attempt: the phases of the attempt and of its ranks.

The executor port (``trainhub.service.ports``) reports these; the pure verdict of an attempt
(:mod:`trainhub.core.verdicts`) reads them through the small protocols below, so that core never
imports the service layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol


class RankPhase(StrEnum):
    STARTING = "starting"  # actor placed, process not yet running
    RUNNING = "running"
    EXITED = "exited"  # process ended; exit_code says how
    LOST = "lost"  # actor or node died; the process state is unknown


class AttemptPhase(StrEnum):
    PLACING = "placing"  # waiting for the placement group or actors
    RUNNING = "running"  # at least one rank running, none failed
    EXITED = "exited"  # every rank's process ended (see exit codes)
    LOST = "lost"  # the attempt's actors or placement are gone
    UNKNOWN = "unknown"  # the executor has never heard of this attempt


class RankReport(Protocol):
    """One rank as the executor saw it (``ports.RankStatus`` is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def phase(self) -> RankPhase: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def detail(self) -> str: ...  # why it ended, beyond its exit code ("" when nothing more)


class AttemptReport(Protocol):
    """One attempt as the executor saw it (``ports.AttemptStatus`` is one)."""

    @property
    def phase(self) -> AttemptPhase: ...
    @property
    def ranks(self) -> Sequence[RankReport]: ...
    @property
    def detail(self) -> str: ...
