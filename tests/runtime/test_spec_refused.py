"""A spec the script cannot follow ends the process with EXIT_SPEC_REFUSED, after the runtime
delivered its metrics, so the control plane fails the trial instead of restarting it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainhub.runtime import protocol
from trainhub.runtime.errors import SpecRefused, refusing_the_spec

SCRIPT = """
import torch, trainhub
ctx = trainhub.init(metrics_file="m.jsonl")
ctx.report(step=0, loss=1.0)
model = torch.nn.Sequential(torch.nn.Linear(4, 2))
ctx.init_model(model, freeze=["fc9.*"])
"""


def _run(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "train.py"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_uncaught_refusal_exits_78_after_delivering_metrics(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    done = _run(tmp_path)
    assert done.returncode == protocol.EXIT_SPEC_REFUSED, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("trainhub.runtime.errors.SpecRefused: model.freeze: 'fc9.*'")
    assert (tmp_path / "m.jsonl").read_text().strip() == '{"step": 0, "loss": 1.0}'


def test_other_errors_keep_their_exit_code(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        SCRIPT.replace('ctx.init_model(model, freeze=["fc9.*"])', "1 / 0")
    )
    done = _run(tmp_path)
    assert done.returncode == 1


def test_transient_errors_are_not_refusals() -> None:
    from trainhub.runtime.distill import TeacherUnreachable

    with pytest.raises(SpecRefused), refusing_the_spec():
        raise ValueError("distill.hints: the student has no layer named 'x'")
    with pytest.raises(TeacherUnreachable), refusing_the_spec():
        raise TeacherUnreachable("teacher: the control plane cannot be reached")


PARALLEL = """
import torch, trainhub
from trainhub import models
ctx = trainhub.init(metrics_file="m.jsonl")
model = models.create("transformer", input_dim=4, max_length=4, dim=8, depth=2, num_heads=2)
ctx.parallelize(model, loss_fn=torch.nn.functional.cross_entropy, split_points=["blocks.9"])
"""


def test_a_pipeline_the_world_cannot_hold_exits_78(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PARALLEL)
    import json
    import os

    section = {"pipeline": {"stages": 2, "microbatches": 2}}
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "TRAINHUB_DISTRIBUTED": json.dumps(section)},
    )
    assert done.returncode == protocol.EXIT_SPEC_REFUSED, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "SpecRefused: distributed.pipeline" in last, last
