"""Following a trial: the live view and the line-per-change view, final metrics, exit codes."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import TIMING, finish, report, start, submit
from trainhub.cli import follow as follow_module
from trainhub.cli.follow import exit_code_of, follow_trial
from trainhub.client import TrainhubClient
from trainhub.core.states import TrialState


def scripted(steps: list[Callable[[], None]]) -> Callable[[float], None]:
    """A fake sleep that moves the trial on by one step per poll."""
    pending = list(steps)

    def sleep(_seconds: float) -> None:
        if pending:
            pending.pop(0)()

    return sleep


def lifecycle(live: LiveServer, trial_id: int, end: TrialState) -> list[Callable[[], None]]:
    attempt: list[int] = []
    return [
        lambda: report(live, trial_id, pending_reason="tenant quota of 8 GPUs in use"),
        lambda: attempt.append(start(live, trial_id)),
        lambda: report(
            live,
            trial_id,
            progress={"current": 2, "total": 5, "unit": "epochs"},
            latest_metrics={"step": 2, "loss": 0.5},
        ),
        lambda: report(
            live,
            trial_id,
            progress={"current": 5, "total": 5, "unit": "epochs"},
            latest_metrics={"step": 5, "loss": 0.125, "val_accuracy": 0.97, **TIMING},
        ),
        lambda: finish(live, trial_id, attempt[0], end, message=f"the trial {end.lower()}"),
    ]


@pytest.mark.parametrize(("end", "code"), [(TrialState.COMPLETED, 0), (TrialState.FAILED, 1)])
def test_follow_prints_each_change_and_the_final_metrics(
    live: LiveServer, end: TrialState, code: int
) -> None:
    trial_id = submit(live)["trial_ids"][0]
    buffer = io.StringIO()
    console = Console(file=buffer, width=120)
    with TrainhubClient(live.url, live.api.admin_token) as client:
        trial = follow_trial(
            client, trial_id, console, live=False, sleep=scripted(lifecycle(live, trial_id, end))
        )
    assert trial["state"] == end
    assert exit_code_of(trial) == code
    lines = buffer.getvalue().splitlines()
    assert "QUEUED" in lines[0]
    assert "waiting for the scheduler" in lines[0]
    assert "tenant quota of 8 GPUs in use" in lines[1]
    assert "RUNNING" in lines[2]
    assert "attempt 1" in lines[2]
    assert "2/5 epochs (40%)" in lines[3]
    assert "5/5 epochs (100%)" in lines[4]
    text = buffer.getvalue()
    assert end.value in lines[5]
    assert f"the trial {end.lower()}" in text
    final = text[text.index("final metrics (step 5)") :]
    assert "val_accuracy" in final
    assert "0.97" in final
    assert "0.125" in final
    assert "where the time goes" in final
    assert "backward" in final
    if end == TrialState.FAILED:
        assert "last attempt: rank 1 exited with 3" in text


def test_the_live_view_redraws_and_ends_with_the_summary(live: LiveServer) -> None:
    trial_id = submit(live)["trial_ids"][0]
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, color_system=None)
    with TrainhubClient(live.url, live.api.admin_token) as client:
        trial = follow_trial(
            client,
            trial_id,
            console,
            live=True,
            sleep=scripted(lifecycle(live, trial_id, TrialState.COMPLETED)),
        )
    assert trial["state"] == "COMPLETED"
    text = buffer.getvalue()
    assert "pending: tenant quota of 8 GPUs in use" in text
    assert "2/5 epochs (40%)" in text
    assert "step 2: loss 0.5" in text
    assert "Ctrl-C stops following" in text
    assert "final metrics (step 5)" in text


def test_the_live_view_of_a_queued_trial() -> None:
    console = Console(file=io.StringIO(), width=100)
    trial = {
        "id": 3,
        "experiment_name": "demo",
        "state": "QUEUED",
        "num_attempts": 0,
        "submitted_at": 0.0,
        "started_at": None,
        "ended_at": None,
        "pending_reason": "needs 16 GPUs on one node; largest free is 8",
        "message": None,
        "progress": {},
        "latest_metrics": {},
    }
    console.print(follow_module.live_view(trial, now=75.0))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "trial 3 (demo) QUEUED, queued 1m 15s" in text
    assert "pending: needs 16 GPUs on one node; largest free is 8" in text


def test_show_follow_exit_codes_through_the_cli(cli: Cli, live: LiveServer) -> None:
    done = submit(live)["trial_ids"][0]
    finish(live, done, start(live, done), TrialState.COMPLETED)
    result = cli("show", "--trial", str(done), "-f")
    assert result.exit_code == 0, result.output
    assert "COMPLETED" in result.stdout
    failed_experiment = submit(live)
    failed = failed_experiment["trial_ids"][0]
    finish(live, failed, start(live, failed), TrialState.FAILED, "a rank failed")
    result = cli("show", str(failed_experiment["id"]), "--follow")
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert "a rank failed" in result.stdout


def test_ctrl_c_stops_following_but_not_the_trial(
    cli: Cli, live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    trial_id = submit(live)["trial_ids"][0]

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(follow_module, "follow_trial", interrupted)
    result = cli("show", "--trial", str(trial_id), "-f")
    assert result.exit_code == 130
    assert f"stopped following; trial {trial_id} keeps running" in result.stderr
    assert f"trainhub cancel --trial {trial_id}" in result.stderr
    with TrainhubClient(live.url, live.api.admin_token) as client:
        assert client.get_trial(trial_id)["state"] == "QUEUED"


def test_submit_follow(
    cli: Cli, live: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit -f follows the new trial and exits with its outcome."""
    from tests.cli.test_submit import project

    real = follow_module.follow_trial

    def fast(client: TrainhubClient, trial_id: int, console: Console) -> dict[str, object]:
        steps = lifecycle(live, trial_id, TrialState.COMPLETED)
        return real(client, trial_id, console, sleep=scripted(steps))

    monkeypatch.setattr(follow_module, "follow_trial", fast)
    result = cli("submit", str(project(tmp_path)), "--follow")
    assert result.exit_code == 0, result.output
    assert "Submitted exp 1" in result.stdout
    assert "final metrics (step 5)" in result.stdout
    assert "0.97" in result.stdout
