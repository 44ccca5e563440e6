"""Recording where an attempt's start went: the rank's marks plus the control plane's own,
kept as one ``startup`` event of the trial (trainhub.core.startup)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainhub.core.errors import FieldError, InvalidSpec
from trainhub.core.startup import EVENT_KIND, RANK_MARKS, format_startup, startup_phases
from trainhub.service.records import Attempt, Trial
from trainhub.service.repository import Repository


def check_rank_marks(marks: Mapping[str, object]) -> dict[str, float]:
    """The marks a rank may send: known names, finite positive numbers (anything else: 422)."""
    errors: list[FieldError] = []
    checked: dict[str, float] = {}
    for name, value in marks.items():
        if name not in RANK_MARKS:
            errors.append(FieldError(f"marks.{name}", f"unknown mark; one of {list(RANK_MARKS)}"))
        elif (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value <= 0
        ):
            errors.append(FieldError(f"marks.{name}", "must be a positive number (epoch seconds)"))
        else:
            checked[name] = float(value)
    if errors:
        raise InvalidSpec(errors[:20])
    return checked


def record_startup(
    repo: Repository,
    trial: Trial,
    attempts: list[Attempt],
    number: int,
    rank_marks: Mapping[str, float],
    warm: bool,
    now: float,
) -> None:
    """Write the ``startup`` event of attempt ``number`` (once: a repeated report is ignored).

    Its queue phase begins when the trial was submitted, or for a later attempt when the one
    before it ended.
    """
    attempt = next(a for a in attempts if a.number == number)
    if any(
        e.kind == EVENT_KIND and e.message.startswith(f"attempt {number}")
        for e in repo.list_events(trial.id)
    ):
        return
    earlier = [a.ended_at for a in attempts if a.number < number and a.ended_at is not None]
    marks: dict[str, float | None] = {
        "submitted_at": max(earlier) if earlier else trial.submitted_at,
        "admitted_at": attempt.created_at,
        **rank_marks,
    }
    phases = startup_phases(number, marks, warm=warm)
    repo.add_event(trial.id, EVENT_KIND, format_startup(phases), now)
