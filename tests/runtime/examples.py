"""The repository's examples run as their docstrings say: where they are, and running one as a
command that must succeed (shared by the runtime's example tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MNIST = EXAMPLES / "mnist"
PLAIN = EXAMPLES / "torchrun_plain"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def json_lines(text: str) -> list[dict[str, float]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
