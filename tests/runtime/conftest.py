from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.fake_control_plane import FakeControlPlane

_LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture(autouse=True)
def clean_launch_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Each test starts as a plain single process in an empty directory."""
    for name in list(os.environ):
        if name.startswith("TRAINHUB_") or name in _LAUNCH_VARS:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    context = sys.modules.get("trainhub.runtime.context")  # not imported: nothing to close
    current = getattr(context, "_current", None)
    if current is not None and not current.closed:
        current.close(timeout_s=5)


@pytest.fixture
def plane() -> Iterator[FakeControlPlane]:
    server = FakeControlPlane().start()
    yield server
    server.stop()


@pytest.fixture
def managed_env(
    monkeypatch: pytest.MonkeyPatch, plane: FakeControlPlane, tmp_path: Path
) -> FakeControlPlane:
    """Rank 0 of trial 7, launched by the (fake) control plane, with fast batching and polling."""
    env = plane.env(
        TRAINHUB_SPOOL_DIR=str(tmp_path / "spool"),
        TRAINHUB_METRICS_BATCH_S="0.1",
        TRAINHUB_SIGNALS_POLL_S="0.1",
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return plane
