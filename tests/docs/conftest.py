"""The doc tests' server: a control plane process of its own on the session's Ray head."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess

PLANE_START_S = 180  # a loaded machine (several test sessions) starts a server slowly


@pytest.fixture
def docs_plane(ray_address: str, tmp_path: Path) -> Iterator[ControlPlaneProcess]:
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlaneProcess(home, ray_address)
    try:
        plane.start(timeout_s=PLANE_START_S)
        yield plane
    finally:
        if plane.token:  # it answered: cancel what still runs
            for experiment in plane.request("GET", "/experiments").json().get("data", []):
                if experiment["state"] == "ACTIVE":
                    plane.request("POST", f"/experiments/{experiment['id']}/cancel")
        plane.stop()  # also one that did not answer in time
