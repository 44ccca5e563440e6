"""End to end: a real control plane process, the session's Ray head, real training processes.

What a user does: submit the example, watch it finish; a worker dies mid-training; the control
plane dies mid-training; an unmodified torchrun script runs as a trial.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.control_plane import REPO, ControlPlaneProcess, pack_dir, rank_pids

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

MNIST = REPO / "examples" / "mnist"
TORCHRUN = REPO / "examples" / "torchrun_plain"


def mnist_spec(**hparams: Any) -> str:
    spec = yaml.safe_load((MNIST / "experiment.yaml").read_text())
    spec["hyperparameters"].update(hparams)
    return yaml.safe_dump(spec)


def steps_of(metrics: list[dict[str, Any]], name: str) -> list[int]:
    return [p["step"] for p in metrics if name in p["values"]]


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
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
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
    assert control_plane.request("GET", "/experiments").json()["count"] == 0


def test_a_spec_line_selects_the_communication_strategy(
    control_plane: ControlPlaneProcess,
) -> None:
    spec = yaml.safe_load(mnist_spec())
    spec["distributed"] = {"strategy": "powersgd", "powersgd": {"rank": 2, "start_step": 5}}
    experiment = control_plane.submit(yaml.safe_dump(spec), MNIST)
    trial_id = experiment["trials"][0]["id"]
    trial = control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    metrics = trial["latest_metrics"]
    assert metrics["val_accuracy"] >= 0.9
    # where the time goes, reported by the example's step timer
    for name in ("time/sync_share", "time/forward_share", "comm/bytes_per_step"):
        assert name in metrics
    # PowerSGD of rank 2 sends far fewer bytes than LeNet-5's 61k fp32 gradients (~245 kB)
    assert 0 < metrics["comm/bytes_per_step"] < 150_000
