"""examples/own-data runs the ways its docstring says: standalone on the folder, and its spec
is valid (tests/e2e/test_datasets.py runs it as a trial on its pushed dataset)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainhub.core.spec import check_entrypoint_exists, parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-data"


def test_the_spec_mounts_the_dataset_it_pushes() -> None:
    spec = parse_spec((EXAMPLE / "experiment.yaml").read_text())
    check_entrypoint_exists(spec, {p.name for p in EXAMPLE.iterdir()})
    assert [(d.name, d.mount) for d in spec.data] == [("spirals", "/data/spirals")]
    assert (EXAMPLE / "requirements.txt").is_file()


def test_it_trains_standalone_on_the_generated_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(data)], check=True)
    assert len((data / "spirals.csv").read_text().splitlines()) == 901
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py")],
        cwd=tmp_path,
        env={**env, "DATA": str(data)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    final = float(done.stdout.split("final val_accuracy")[-1])
    assert final > 0.8, done.stdout[-2000:]
