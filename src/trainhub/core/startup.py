"""Where the time from submit to a trial's first optimizer step goes, phase by phase.

Every attempt records a few timestamps along its start (the control plane, the rank's actor on
the node and the runtime inside the rank each add theirs); :func:`startup_phases` turns them into
the eight phases ``trainhub show`` and the trial page list. The control plane keeps them as one
trial event of kind :data:`EVENT_KIND` whose message :func:`format_startup` writes and
:func:`parse_startup` reads back (no schema change; ADR 0028).

Phases (each from one mark to the next; a missing mark leaves its phases out):

- queue: submitted (or the previous attempt ended) -> the control loop admitted the trial
- admit: admitted -> the attempt was handed to the executor (token, code, launch request)
- place: handed over -> the rank's actor runs on its node (placement group, actor process)
- environment: actor runs -> the rank's process is spawned (code unpacked, sandbox, rendezvous)
- start: spawned -> the interpreter of the rank runs (sandbox and process start)
- import: interpreter runs -> ``trainhub.init()`` is called (python, torch, the user's imports)
- process_group: init called -> torch.distributed's process group is up
- first_step: process group up -> the first optimizer step ended

Marks come from rank 0 (its first step waits for every rank at the process group's rendezvous).
Clocks of the control plane and the node may differ by their skew (NTP keeps it at
milliseconds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

EVENT_KIND = "startup"
PHASES = (
    "queue",
    "admit",
    "place",
    "environment",
    "start",
    "import",
    "process_group",
    "first_step",
)
# the mark each phase ends at; a phase begins at the previous phase's end mark
MARKS = (
    "submitted_at",
    "admitted_at",
    "launched_at",
    "actor_at",
    "spawned_at",
    "process_at",
    "init_at",
    "process_group_at",
    "first_step_at",
)
# marks a rank sends (launched_at it got from the control plane with its environment; the
# first two the control plane knows)
RANK_MARKS = MARKS[2:]
LABELS = {"process_group": "process-group init", "first_step": "first step"}
_PREFIX = "attempt "
_ITEM = re.compile(r"^(?P<label>[a-z -]+) (?P<seconds>-?\d+(?:\.\d+)?) s$")


@dataclass(frozen=True)
class StartupPhases:
    """Seconds each phase of one attempt's start took (phases whose marks were missing are
    absent), and the whole from submit (or the previous attempt's end) to the first step."""

    attempt: int
    phases: dict[str, float]
    total_s: float | None
    warm: bool = False  # the rank came from a warm pool (adapters/ray_executor/warm_pool.py)


def startup_phases(
    attempt: int, marks: Mapping[str, float | None], *, warm: bool = False
) -> StartupPhases:
    """The phases between consecutive marks; a negative gap (clock skew) counts as 0."""
    usable = {k: v for k, v in marks.items() if v is not None and math.isfinite(v) and v > 0}
    phases: dict[str, float] = {}
    for phase, begin, end in zip(PHASES, MARKS, MARKS[1:], strict=False):
        if begin in usable and end in usable:
            phases[phase] = max(0.0, usable[end] - usable[begin])
    total = None
    if MARKS[0] in usable and MARKS[-1] in usable:
        total = max(0.0, usable[MARKS[-1]] - usable[MARKS[0]])
    return StartupPhases(attempt, phases, total, warm)


def format_startup(startup: StartupPhases) -> str:
    """``attempt 1 (warm): queue 0.01 s, admit 0.02 s, ...; total 1.83 s`` (the event text)."""
    head = f"{_PREFIX}{startup.attempt}{' (warm)' if startup.warm else ''}"
    items = [f"{label(p)} {startup.phases[p]:.3f} s" for p in PHASES if p in startup.phases]
    text = f"{head}: {', '.join(items)}"
    if startup.total_s is not None:
        text += f"; total {startup.total_s:.3f} s"
    return text


def parse_startup(message: str) -> StartupPhases | None:
    """The phases of a :data:`EVENT_KIND` event's message; None for any other text."""
    if not message.startswith(_PREFIX) or ": " not in message:
        return None
    head, _, body = message.partition(": ")
    warm = head.endswith(" (warm)")
    number = head[len(_PREFIX) :].removesuffix(" (warm)")
    if not number.isdigit():
        return None
    body, _, tail = body.partition("; total ")
    by_label = {label(p): p for p in PHASES}
    phases: dict[str, float] = {}
    for item in filter(None, body.split(", ")):
        match = _ITEM.match(item)
        if match is None or match["label"] not in by_label:
            return None
        phases[by_label[match["label"]]] = float(match["seconds"])
    total = None
    if tail:
        if not tail.endswith(" s"):
            return None
        try:
            total = float(tail[:-2])
        except ValueError:
            return None
    return StartupPhases(int(number), phases, total, warm)


def label(phase: str) -> str:
    """How a phase is named to users."""
    return LABELS.get(phase, phase)
