"""End to end: a teacher trial, then a two-rank student trial whose spec distils from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "distill_workload"


def spec(name: str, script: str, workers: int, **extra: object) -> str:
    return yaml.safe_dump(
        {
            "name": name,
            "entrypoint": f"python {script}",
            "resources": {"workers": workers, "cpus_per_worker": 0.5},
            "max_restarts": 0,
            **extra,
        }
    )


def test_a_student_trial_distils_from_a_teacher_trial(control_plane: ControlPlaneProcess) -> None:
    teacher = control_plane.submit(spec("teacher", "teacher.py", 1), WORKLOAD)["trials"][0]
    done = control_plane.wait_for(teacher["id"], lambda t: t["state"] == "COMPLETED", 120, "done")
    teacher_accuracy = done["latest_metrics"]["val_accuracy"]
    assert teacher_accuracy > 0.85

    distill = {
        "teacher": f"trial:{teacher['id']}",
        "temperature": 2.0,
        "alpha": 0.8,
        "hints": [{"student": "0", "teacher": "0"}],
    }
    student = control_plane.submit(spec("student", "student.py", 2, distill=distill), WORKLOAD)
    trial_id = student["trials"][0]["id"]
    trial = control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", 120, "done")
    metrics = trial["latest_metrics"]
    # the ranks ran the teacher the spec named, with its trained weights
    assert metrics["teacher_accuracy"] == pytest.approx(teacher_accuracy)
    assert metrics["val_accuracy"] > 0.7
    points = [p["values"] for p in control_plane.metrics(trial_id) if "hints" in p["values"]]
    assert points[-1]["hints"] < points[0]["hints"]
    assert points[-1]["soft"] < points[0]["soft"]
    # the adapters are data-parallel too: both ranks end with the same weights
    sums = [re.findall(r"adapter_sum=(\S+)", control_plane.log(trial_id, r)) for r in (0, 1)]
    assert sums[0]
    assert sums[0] == sums[1]
