"""`submit --follow` / `show -f`: the chief rank's output beside state changes, across attempts."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from rich.console import Console

from tests.cli.conftest import LiveServer
from tests.cli.helpers import finish, report, start, submit
from trainhub.cli.follow import follow_trial
from trainhub.client import TrainhubClient
from trainhub.core.states import TrialState
from trainhub.service.keys import log_key
from trainhub.service.records import AttemptUpdate, TrialUpdate


def test_follow_shows_the_chief_output_live_and_moves_on_to_a_new_attempt(
    live: LiveServer,
) -> None:
    trial_id = submit(live)["trial_ids"][0]
    store = live.api.store
    written = {1: 0, 2: 0}
    attempts: list[int] = []

    def write(attempt: int, text: str) -> None:
        data = text.encode()
        store.write_at(log_key("default", trial_id, attempt, 0), written[attempt], data)
        written[attempt] += len(data)

    def restart() -> None:
        write(1, "epoch 2 loss 0.4\n")  # written just before the attempt ended
        write(2, "resumed from step 2\n")
        now = time.time()
        with live.api.services.uow() as repo:
            repo.update_attempt(attempts[0], AttemptUpdate(outcome="LOST", ended_at=now))
            repo.add_attempt(trial_id, 2, f"attempt-{trial_id}-2", ("node-b",), None, None, now)
            repo.update_trial(trial_id, TrialUpdate(num_attempts=2))

    steps: list[Callable[[], None]] = [
        lambda: (attempts.append(start(live, trial_id)), write(1, "epoch 1 loss 0.9\n")),
        lambda: report(live, trial_id, progress={"current": 1, "total": 3, "unit": "epochs"}),
        restart,
        lambda: write(2, "epoch 3 loss 0.1\n"),
        lambda: finish(live, trial_id, attempts[0], TrialState.COMPLETED),
    ]

    def sleep(_seconds: float) -> None:
        if steps:
            steps.pop(0)()

    buffer = io.StringIO()
    with TrainhubClient(live.url, live.api.admin_token) as client:
        trial = follow_trial(
            client, trial_id, Console(file=buffer, width=120), live=False, sleep=sleep
        )
    assert trial["state"] == "COMPLETED"
    lines = buffer.getvalue().splitlines()
    expected = [
        "epoch 1 loss 0.9",
        "epoch 2 loss 0.4",
        "--- attempt 2 ---",
        "resumed from step 2",
        "epoch 3 loss 0.1",
    ]
    positions = [lines.index(e) for e in expected]
    assert positions == sorted(positions)
    assert sum(line.startswith("epoch") for line in lines) == 3  # nothing twice
    running = next(i for i, line in enumerate(lines) if "RUNNING" in line)
    assert running < positions[0]  # the state change first, then what the chief wrote
    assert any("1/3 epochs" in line for line in lines)
