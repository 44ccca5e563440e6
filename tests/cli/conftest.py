"""A real trainhub API served over HTTP on a free port, and a CliRunner aimed at it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.fixtures.api import Api, build_api, serve
from trainhub.cli.main import app


@dataclass
class LiveServer:
    api: Api
    url: str

    def count_experiments(self) -> int:
        r = self.api.client.get("/api/v1/experiments", headers=self.api.headers())
        return int(r.json()["count"])


@pytest.fixture
def live(sqlite_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    api = build_api(sqlite_url, tmp_path)
    try:
        with serve(api.client.app) as port:
            yield LiveServer(api, f"http://127.0.0.1:{port}")
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real login, home or server of the user running the tests leaks in."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TRAINHUB_HOME", str(tmp_path / "home"))
    for name in ("TRAINHUB_URL", "TRAINHUB_TOKEN", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)


@dataclass
class Cli:
    """Runs ``trainhub ...`` in-process against a server with a token."""

    url: str
    token: str | None

    def __call__(self, *args: str, token: str | None = "", url: str | None = None) -> Result:
        env = {"TRAINHUB_URL": url or self.url, "COLUMNS": "200"}
        chosen = self.token if token == "" else token
        if chosen:
            env["TRAINHUB_TOKEN"] = chosen
        result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
        assert "Traceback" not in result.output, result.output
        return result


@pytest.fixture
def cli(live: LiveServer) -> Cli:
    return Cli(live.url, live.api.admin_token)
