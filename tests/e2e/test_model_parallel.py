"""End to end (issue 28): a 4-rank pipeline x tensor parallel trial through the real server
matches one process's losses; killed at step 3, it resumes from its sharded checkpoint and
reaches the same step-5 loss; a split point naming no layer fails the trial at once (exit 78,
no restart); a world that does not factor is a 422 at submit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.distributed.model_parallel_ranks import reference_losses
from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "model_parallel_workload"


def spec(name: str, workers: int, distributed: dict[str, object], argv: str = "") -> str:
    return yaml.safe_dump(
        {
            "name": name,
            "entrypoint": f"python train.py {argv}".strip(),
            "resources": {"workers": workers, "cpus_per_worker": 1},
            "max_restarts": 1,
            "distributed": distributed,
        }
    )


def test_pp2_tp2_trial_resumes_across_a_kill_with_one_process_losses(
    control_plane: ControlPlaneProcess,
) -> None:
    layout = {"pipeline": {"stages": 2, "microbatches": 4, "schedule": "1f1b"}, "tensor": 2}
    bad = control_plane.request(
        "POST",
        "/experiments",
        data={"spec": spec("mp-bad", 3, layout)},
    )
    assert bad.status_code == 422, bad.text
    assert "distributed.pipeline.stages" in bad.text
    assert "multiple of 4" in bad.text

    trial_id = control_plane.submit(spec("mp", 4, layout, "crash"), WORKLOAD)["trials"][0]["id"]
    refused = {"pipeline": {"stages": 2, "microbatches": 2, "split_points": ["blocks.9"]}}
    refused_id = control_plane.submit(spec("mp-refused", 2, refused), WORKLOAD)["trials"][0]["id"]

    wrong = control_plane.wait_for(
        refused_id, lambda t: t["state"] in ("FAILED", "COMPLETED"), what="refused"
    )
    assert wrong["state"] == "FAILED"
    attempts = [(a["outcome"], a["detail"]) for a in wrong["attempts"]]
    assert wrong["num_restarts"] == 0, attempts
    detail = wrong["attempts"][-1]["detail"]
    assert "refused the spec (exit code 78)" in detail, wrong["attempts"]
    # the refusing rank's words, whichever rank got there first (the other is stopped)
    assert "'blocks.9' names no layer" in detail, detail

    trial = control_plane.wait_for(
        trial_id, lambda t: t["state"] in ("COMPLETED", "FAILED"), timeout_s=300, what="done"
    )
    assert trial["state"] == "COMPLETED", trial["attempts"]
    assert trial["num_restarts"] == 1
    first, second = trial["attempts"]
    assert first["outcome"] == "FAILED"
    assert second["restored_checkpoint_id"] is not None
    losses = {
        p["step"]: p["values"]["loss"]
        for p in control_plane.metrics(trial_id)
        if "loss" in p["values"]
    }
    reference = reference_losses()
    assert sorted(losses) == [0, 1, 2, 3, 4]
    for step, loss in losses.items():
        assert abs(loss - reference[step]) <= 1e-5, (step, loss, reference[step])
    metrics = trial["latest_metrics"]
    assert 0 <= metrics["time/bubble_share"] < 1
    assert 0 < metrics["time/tp_comm_share"] < 1
    assert "resumed from the checkpoint of step 2" in control_plane.log(trial_id, 0, attempt=2)
