"""One id space for users: which experiment or trial a command's ID names, and how ids print.

Users see two kinds of id: an experiment's (what ``submit`` prints) and a trial's (one run of
it). Commands about one run (``logs``, ``metrics``, ``debug``, ``profile``) take either:

- ``22`` or ``exp/22``: experiment 22; its trial when it has one, else the command lists its
  trials and asks which (exit 2);
- ``trial/34``, or ``34 --trial``: trial 34.

Ids print as ``exp 22`` and ``trial 34`` everywhere, so the two are never mixed up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainhub.cli.session import EXIT_INVALID_INPUT, err, fail

if TYPE_CHECKING:
    from trainhub.client import TrainhubClient

ID_HELP = (
    "An experiment (22 or exp/22; its trial when it has one) or a trial (trial/34, or 34 with "
    "--trial)."
)
TrialOpt = Annotated[bool, typer.Option("--trial", "-t", help="A bare number in ID is a trial id.")]
_REF = re.compile(r"^(?:(exp|experiment|trial)[/:]?)?\s*(\d{1,18})$", re.IGNORECASE)


@dataclass(frozen=True)
class Ref:
    """What an ID argument names."""

    kind: str  # "exp" or "trial"
    id: int

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"


def exp_label(experiment_id: object) -> str:
    return f"exp {experiment_id}"


def trial_label(trial_id: object) -> str:
    return f"trial {trial_id}"


def parse_ref(text: str, trial: bool = False) -> Ref:
    """``22`` / ``exp/22`` -> experiment 22; ``trial/34`` (or ``34`` with ``trial``) -> trial 34.

    Raises:
        typer.Exit: (code 2) the text names neither, or ``--trial`` contradicts ``exp/N``.
    """
    match = _REF.match(text.strip())
    if match is None:
        raise fail(
            f"{text!r} is not an experiment or trial id",
            "write 22 or exp/22 for an experiment, trial/34 (or 34 --trial) for a trial",
            code=EXIT_INVALID_INPUT,
        )
    prefix, number = (match.group(1) or "").lower(), int(match.group(2))
    if prefix.startswith("exp") and trial:
        raise fail(
            f"{text!r} names an experiment but --trial was given",
            f"write trial/{number} for a trial, or leave --trial out",
            code=EXIT_INVALID_INPUT,
        )
    return Ref("trial" if prefix == "trial" or trial else "exp", number)


def trial_of(client: TrainhubClient, ref: Ref, command: str) -> int:
    """The trial ``ref`` names: itself, or the one trial of an experiment.

    An experiment with several trials (a search) is refused with its trials listed, so the
    user can pick one (exit 2)."""
    if ref.kind == "trial":
        return ref.id
    experiment = client.get_experiment(ref.id)
    trials: list[dict[str, Any]] = list(experiment.get("trials") or [])
    ids = [int(t["id"]) for t in trials] or [int(i) for i in experiment.get("trial_ids") or []]
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise fail(
            f"{exp_label(ref.id)} has no trial yet",
            f"its search makes them as it runs; see `trainhub show {ref.id}`",
            code=EXIT_INVALID_INPUT,
        )
    err.print(f"[bold red]error:[/] {exp_label(ref.id)} has {len(ids)} trials; which one?")
    for t in trials[:20] or [{"id": i} for i in ids[:20]]:
        state = f"  {t['state']}" if t.get("state") else ""
        err.print(f"  trainhub {command} trial/{t['id']}{state}")
    if len(ids) > 20:
        err.print(f"  ... and {len(ids) - 20} more: `trainhub trials {ref.id}` ranks them")
    return _exit()


def _exit() -> int:
    raise typer.Exit(EXIT_INVALID_INPUT)
