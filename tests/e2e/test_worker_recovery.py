"""End to end: a rank of a running trial is killed (SIGKILL); the trial restarts from its last
checkpoint and loses no step."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests.e2e.examples import MNIST, mnist_spec, steps_of
from tests.fixtures.control_plane import ControlPlaneProcess, rank_pids

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


def test_killed_worker_restarts_from_checkpoint_without_losing_steps(
    control_plane: ControlPlaneProcess,
) -> None:
    epochs = 8
    experiment = control_plane.submit(mnist_spec(epochs=epochs, sleep_per_epoch_s=1.5), MNIST)
    trial_id = experiment["trials"][0]["id"]
    control_plane.wait_for(
        trial_id,
        lambda t: (
            t["state"] == "RUNNING"
            and len(t["checkpoints"]) >= 1
            and t["latest_metrics"].get("step", 0) >= 2
        ),
        what="RUNNING with a checkpoint",
    )
    pids = rank_pids(trial_id, rank=1)
    assert pids, "rank 1's process was not found"
    killed = 0
    for pid in pids:  # the rank and its children; a short-lived child may be gone already
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    assert killed, f"every process of rank 1 ({pids}) was gone before the kill"
    trial = control_plane.wait_for(
        trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=240, what="COMPLETED"
    )
    assert trial["num_attempts"] == 2
    assert trial["num_restarts"] == 1
    first, second = trial["attempts"]
    assert first["outcome"] == "FAILED"
    assert "exited with code -9" in first["detail"]
    assert second["restored_checkpoint_id"] is not None
    assert second["outcome"] == "SUCCEEDED"
    # every epoch reported exactly once, none lost
    assert steps_of(control_plane.metrics(trial_id), "val_accuracy") == list(range(epochs))
    assert trial["latest_metrics"]["val_accuracy"] >= 0.95
    restored = control_plane.log(trial_id, 0, attempt=2)
    assert "resum" in restored.lower(), restored[-2000:]
