"""Following a trial until it ends: a live view on a terminal, one line per change elsewhere.

:func:`follow_trial` takes the client, so tests drive it against a real server whose trial
state they set through the repository. Ctrl-C raises KeyboardInterrupt out of it; the caller
says that only the following stopped (the trial keeps running).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from trainhub.cli import render
from trainhub.client import TERMINAL_STATES
from trainhub.core.step_timing import is_runtime_metric, split_metrics

if TYPE_CHECKING:
    from trainhub.client import TrainhubClient

JSON = dict[str, Any]


def live_view(trial: JSON, now: float | None = None) -> RenderableType:
    """What the live view shows while a trial has not ended."""
    parts: list[RenderableType] = [render.trial_status_line(trial, now)]
    if trial["state"] == "QUEUED" and trial.get("pending_reason"):
        parts.append(Text.assemble(("pending: ", "dim"), (trial["pending_reason"], "yellow")))
    if trial.get("message"):
        parts.append(Text(trial["message"], style="dim"))
    progress = render.progress_renderable(trial.get("progress") or {})
    if progress is not None:
        parts.append(progress)
    plain, _ = split_metrics(trial.get("latest_metrics") or {})
    if plain:
        step = trial["latest_metrics"].get("step")
        values = "  ".join(f"{k} {render.fmt_value(v)}" for k, v in sorted(plain.items()))
        parts.append(Text(f"step {step}: {values}" if step is not None else values))
    parts.append(Text("Ctrl-C stops following; the trial keeps running", style="dim"))
    return Group(*parts)


def last_values(points: list[JSON] | None) -> dict[str, tuple[Any, int]]:
    """Each metric's last value and the step it was reported at (``ctx.watch`` reports per
    batch, the script per epoch: one "latest step" would be right for neither)."""
    last: dict[str, tuple[Any, int]] = {}
    for p in sorted(points or [], key=lambda p: (p["attempt"], p["step"])):
        for key, value in p["values"].items():
            last[key] = (value, int(p["step"]))
    return last


def final_view(trial: JSON, points: list[JSON] | None = None) -> RenderableType:
    """The summary printed once the trial has ended: outcome, the script's own final metrics
    (each at its own last step, when ``points`` are given), timings; the runtime's layer and
    system series stay in `trainhub metrics --all`."""
    parts: list[RenderableType] = [render.trial_status_line(trial)]
    if trial.get("message"):
        style = "red" if trial["state"] == "FAILED" else "dim"
        parts.append(Text(trial["message"], style=style))
    attempts = trial.get("attempts") or []
    if trial["state"] == "FAILED" and attempts and attempts[-1].get("detail"):
        parts.append(Text(f"last attempt: {attempts[-1]['detail']}", style="red"))
    plain, profiling = split_metrics(trial.get("latest_metrics") or {})
    plain = {k: v for k, v in plain.items() if not is_runtime_metric(k)}
    if plain:
        last = last_values(points)
        steps = {last[k][1] for k in plain if k in last}
        if not steps:  # no points to read each metric's step from: the trial's latest step
            step = trial["latest_metrics"].get("step")
        else:
            step = steps.pop() if len(steps) == 1 else None
        title = "final metrics" + (f" (step {step})" if step is not None else "")
        if len(steps) > 1:  # several steps: each metric says its own
            values = {k: f"{render.fmt_value(v)} (step {last[k][1]})" for k, v in plain.items()}
            parts += [Text(""), render.metrics_table(values, title)]
        else:
            parts += [Text(""), render.metrics_table(plain, title)]
    timing = render.timing_table(profiling)
    if timing is not None:
        parts += [Text(""), timing]
    return Group(*parts)


def _change_line(trial: JSON) -> Text:
    line = render.trial_status_line(trial)
    if trial["state"] == "QUEUED" and trial.get("pending_reason"):
        line.append(f": {trial['pending_reason']}", style="yellow")
    progress = trial.get("progress") or {}
    if progress.get("total") and progress.get("current") is not None:
        current, total = float(progress["current"]), float(progress["total"])
        unit = progress.get("unit") or "steps"
        line.append(
            f", {render.fmt_value(current)}/{render.fmt_value(total)} {unit} "
            f"({current / total:.0%})"
        )
    return line


def _change_key(trial: JSON) -> tuple[object, ...]:
    """What a line is printed for when it changes: state, pending reason, each tenth of progress."""
    progress = trial.get("progress") or {}
    tenth = None
    if progress.get("total") and progress.get("current") is not None:
        tenth = int(10 * float(progress["current"]) / float(progress["total"]))
    return (trial["state"], trial.get("pending_reason"), trial["num_attempts"], tenth)


class ChiefOutput:
    """The chief rank's (rank 0's) output, read on from where the last poll stopped; a new
    attempt (after a restart or a preemption) is read from its beginning."""

    def __init__(self, client: TrainhubClient, trial_id: int) -> None:
        self.client = client
        self.trial_id = trial_id
        self.attempt = 0
        self.offset = 0

    def read(self, trial: JSON) -> list[Text]:
        """The lines written since the last call (the latest attempt's, then on)."""
        latest = max((a["number"] for a in trial.get("attempts") or []), default=0)
        if latest == 0:
            return []
        out: list[Text] = []
        if latest != self.attempt:
            if self.attempt:  # what the previous attempt wrote last, before moving on
                out += self._drain()
                out.append(Text(f"--- attempt {latest} ---", style="dim"))
            self.attempt, self.offset = latest, 0
        return out + self._drain()

    def _drain(self, max_rounds: int = 16) -> list[Text]:
        lines: list[Text] = []
        for _ in range(max_rounds):
            chunk = self.client.read_logs(self.trial_id, 0, self.attempt, self.offset)
            if chunk["next_offset"] <= self.offset:
                break
            self.offset = chunk["next_offset"]
            lines += [Text(line) for line in chunk["text"].splitlines()]
        return lines


def follow_trial(
    client: TrainhubClient,
    trial_id: int,
    console: Console,
    *,
    poll_interval_s: float = 1.0,
    live: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
    output: bool = True,
) -> JSON:
    """Show the trial until it ends and return its final details.

    Args:
        client: the API client.
        trial_id: the trial to follow.
        console: where to draw.
        poll_interval_s: seconds between polls.
        live: redraw in place (Rich Live); default: when ``console`` is a terminal. Otherwise
            a line is printed whenever the state or the pending reason changes.
        sleep: how to wait between polls (tests pass a fake).
        output: show the chief rank's output as it is written (above the live view, or
            between the change lines).
    """
    use_live = console.is_terminal if live is None else live
    chief = ChiefOutput(client, trial_id) if output else None

    def print_output(trial: JSON) -> None:
        for line in chief.read(trial) if chief is not None else ():
            console.print(line, highlight=False, markup=False)

    trials = client.watch_trial(trial_id, poll_interval_s, sleep=sleep)  # ends with its end
    first = trial = next(trials)
    if use_live:
        with Live(live_view(trial), console=console, refresh_per_second=4, transient=True) as view:
            print_output(trial)
            for trial in trials:
                print_output(trial)  # printed above the live view, which stays at the bottom
                view.update(live_view(trial), refresh=True)
    else:
        last: tuple[object, ...] | None = None
        for trial in itertools.chain([first], trials):
            key = _change_key(trial)
            if key != last and trial["state"] not in TERMINAL_STATES:
                console.print(_change_line(trial))
                last = key
            print_output(trial)
    points = client.list_metrics(trial_id, limit=100_000)
    console.print(final_view(trial, points))
    return trial


def exit_code_of(trial: JSON) -> int:
    """0 when the trial completed, 1 when it failed, was canceled or pruned."""
    return 0 if trial["state"] == "COMPLETED" else 1
