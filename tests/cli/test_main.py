"""The entry point: cheap to import; `trainhub server` builds the Settings it is given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainhub.cli.main import app


def test_importing_the_cli_pulls_in_no_heavy_or_server_side_module() -> None:
    code = (
        "import sys, trainhub.cli.main\n"
        "heavy = ('torch', 'ray', 'sqlalchemy', 'fastapi', 'uvicorn', 'optuna', 'numpy',"
        " 'trainhub.server', 'trainhub.adapters')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"


def test_server_builds_settings_from_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainhub.server

    seen: list[trainhub.server.Settings] = []
    monkeypatch.setattr(trainhub.server, "serve", seen.append)
    result = CliRunner().invoke(
        app,
        [
            "server",
            "--db",
            "postgresql://trainhub@db.internal:5432/trainhub",
            "--ray-address",
            "10.0.0.1:6379",
            "--storage",
            str(tmp_path / "store"),
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--home",
            str(tmp_path / "home"),
            "--advertise-url",
            "http://head.internal:9000",
            "--num-cpus",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.database_url == "postgresql://trainhub@db.internal:5432/trainhub"
    assert settings.ray_address == "10.0.0.1:6379"
    assert settings.storage_root == tmp_path / "store"
    assert (settings.host, settings.port) == ("0.0.0.0", 9000)
    assert settings.home == tmp_path / "home"
    assert settings.api_url == "http://head.internal:9000"
    assert settings.ray_num_cpus == 4


def test_server_defaults_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainhub.server

    seen: list[trainhub.server.Settings] = []
    monkeypatch.setattr(trainhub.server, "serve", seen.append)
    result = CliRunner().invoke(
        app, ["server"], env={"TRAINHUB_HOME": str(tmp_path), "TRAINHUB_PORT": "8123"}
    )
    assert result.exit_code == 0, result.output
    assert seen[0].home == tmp_path
    assert seen[0].port == 8123
    assert seen[0].database_url == f"sqlite:///{tmp_path / 'trainhub.db'}"


def test_server_reports_a_database_it_cannot_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    import trainhub.server

    def refuse(_settings: object) -> None:
        raise OperationalError("connect", {}, Exception("connection refused"))

    monkeypatch.setattr(trainhub.server, "serve", refuse)
    result = CliRunner().invoke(app, ["server", "--db", "postgresql://nobody:pw@127.0.0.1:1/x"])
    assert result.exit_code == 1
    assert "cannot open the database postgresql://nobody:***@127.0.0.1:1/x" in result.stderr
    assert "Traceback" not in result.output


def test_server_help_names_the_default_policy_of_the_code() -> None:
    from trainhub.cli.main import Policy
    from trainhub.core.scheduling.factory import DEFAULT_POLICY, POLICY_NAMES
    from trainhub.server import Settings

    assert DEFAULT_POLICY == Settings().policy == "fair"
    assert tuple(p.value for p in Policy) == POLICY_NAMES
    result = CliRunner().invoke(app, ["server", "--help"], env={"COLUMNS": "400"})
    text = " ".join(result.output.split())
    assert "default: fair." in text
    for name in POLICY_NAMES:
        assert f"{name}:" in text


def test_server_defaults_come_from_the_fair_share_config() -> None:
    from trainhub.core.scheduling.fair_config import FairShareConfig
    from trainhub.server import Settings, make_policy

    config, settings = FairShareConfig(), Settings()
    assert settings.min_run_time_s == config.min_run_time_s
    assert settings.preemption_cooldown_s == config.preemption_cooldown_s
    assert settings.usage_half_life_s == config.half_life_s
    assert settings.reclaim_patience == config.patience_share
    assert make_policy(settings).config == config  # type: ignore[attr-defined]
    result = CliRunner().invoke(app, ["server", "--help"], env={"COLUMNS": "400"})
    text = " ".join(result.output.split())
    assert f"preempted (fair share); default: {config.min_run_time_s:g}." in text
    assert f"(fair share); default: {config.preemption_cooldown_s:g}." in text


def test_help_documents_the_ids_and_the_exit_codes() -> None:
    from typer.testing import CliRunner

    from trainhub.cli.main import app

    text = " ".join(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output.split())
    assert "exp/22" in text
    assert "trial/34" in text
    assert "2 the input was refused" in text
    assert "1 a server fault (5xx) or no server answered" in text
    logs = " ".join(
        CliRunner().invoke(app, ["logs", "--help"], env={"COLUMNS": "200"}).output.split()
    )
    assert "trial/34" in logs
