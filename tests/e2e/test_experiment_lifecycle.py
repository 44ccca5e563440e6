"""End to end: a real control plane process, the session's Ray head, real training processes.

What a user does: submit the example and watch it finish, run an unmodified torchrun script as
a trial, cancel one, submit one that can never fit. (A worker or the control plane dying
mid-training, and the strategy line, have files of their own: each trains MNIST for a minute or
more, and ``--dist loadfile`` runs a file on one worker, so one file of them all would be the
last worker's long tail.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.examples import MNIST, TORCHRUN, mnist_spec, steps_of
from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir, rank_pids

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


def test_mnist_example_completes_with_target_accuracy(control_plane: ControlPlaneProcess) -> None:
    experiment = control_plane.submit(mnist_spec(), MNIST)
    trial_id = experiment["trials"][0]["id"]
    trial = control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    assert trial["latest_metrics"]["val_accuracy"] >= 0.95
    assert trial["num_attempts"] == 1
    (attempt,) = trial["attempts"]
    assert attempt["outcome"] == "SUCCEEDED"
    assert attempt["exit_codes"] == [0, 0]
    assert trial["checkpoints"], "the example checkpoints every epoch"
    epochs = yaml.safe_load((MNIST / "experiment.yaml").read_text())["hyperparameters"]["epochs"]
    assert steps_of(control_plane.metrics(trial_id), "val_accuracy") == list(range(epochs))
    assert trial["progress"]["current"] == trial["progress"]["total"]
    # rank 0's output was kept and can be read back
    assert f"epoch {epochs - 1}: train_loss=" in control_plane.log(trial_id, 0)
    experiment = control_plane.request("GET", f"/experiments/{experiment['id']}").json()
    assert experiment["state"] == "COMPLETED"


def test_unmodified_torchrun_script_runs_as_a_two_worker_trial(
    control_plane: ControlPlaneProcess,
) -> None:
    spec = (TORCHRUN / "experiment.yaml").read_text()
    experiment = control_plane.submit(spec, TORCHRUN)
    trial_id = experiment["trials"][0]["id"]
    trial = control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    assert trial["attempts"][0]["exit_codes"] == [0, 0]
    output = control_plane.log(trial_id, 0)
    assert "world_size=2" in output.replace(" ", "") or "WORLD_SIZE=2" in output, output[-2000:]


def test_cancel_ends_the_process_tree(control_plane: ControlPlaneProcess) -> None:
    experiment = control_plane.submit(mnist_spec(epochs=50, sleep_per_epoch_s=2.0), MNIST)
    trial_id = experiment["trials"][0]["id"]
    control_plane.wait_for(trial_id, lambda t: t["state"] == "RUNNING", what="RUNNING")
    deadline = time.monotonic() + 60
    while not rank_pids(trial_id, 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    pids = rank_pids(trial_id, 0) + rank_pids(trial_id, 1)
    assert pids
    r = control_plane.request("POST", f"/experiments/{experiment['id']}/cancel")
    assert r.status_code == 200
    trial = control_plane.wait_for(trial_id, lambda t: t["state"] == "CANCELED", what="CANCELED")
    assert trial["attempts"][0]["outcome"] == "KILLED"
    import psutil

    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_a_trial_that_can_never_fit_says_why(
    control_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    """Refused at submit against the Ray cluster's real nodes, naming the field and the
    largest node (issue 14): it would otherwise wait forever."""
    (tmp_path / "train.py").write_text("print('never runs')\n")
    spec = (
        "name: too-big\nentrypoint: python train.py\nresources: {workers: 2, gpus_per_worker: 4}\n"
    )
    before = control_plane.request("GET", "/experiments").json()["count"]
    r = control_plane.request(
        "POST",
        "/experiments",
        data={"spec": spec},
        files={"context": ("context.tar.gz", pack_dir(tmp_path), "application/gzip")},
    )
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["path"] == "resources.gpus_per_worker"
    assert "the largest node has" in error["message"]
    assert control_plane.request("GET", "/experiments").json()["count"] == before  # none made
