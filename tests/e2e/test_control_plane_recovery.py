"""End to end: the control plane process is killed (SIGKILL) mid-training and started again on
the same home; the trial goes on and keeps every metric."""

from __future__ import annotations

import time

import pytest

from tests.e2e.examples import MNIST, mnist_spec, steps_of
from tests.fixtures.control_plane import ControlPlaneProcess, rank_pids

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


def test_control_plane_restart_keeps_the_trial_and_its_metrics(
    control_plane: ControlPlaneProcess,
) -> None:
    epochs = 8
    experiment = control_plane.submit(mnist_spec(epochs=epochs, sleep_per_epoch_s=1.5), MNIST)
    trial_id = experiment["trials"][0]["id"]
    control_plane.wait_for(
        trial_id,
        lambda t: t["state"] == "RUNNING" and t["latest_metrics"].get("step", -1) >= 1,
        what="RUNNING with metrics",
    )
    pids_before = set(rank_pids(trial_id, 0) + rank_pids(trial_id, 1))
    control_plane.kill()
    # the training goes on without the control plane; its reports wait in the runtime
    time.sleep(4)
    assert pids_before <= {p for r in (0, 1) for p in rank_pids(trial_id, r)} or not pids_before
    control_plane.start()
    trial = control_plane.wait_for(
        trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=240, what="COMPLETED"
    )
    assert trial["num_attempts"] == 1, trial["attempts"]
    assert steps_of(control_plane.metrics(trial_id), "val_accuracy") == list(range(epochs))
    assert trial["latest_metrics"]["val_accuracy"] >= 0.95
