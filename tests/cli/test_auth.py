"""login/whoami, where the connection comes from, and the messages for no server or no token."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, LiveServer
from trainhub.client import credentials_path, resolve_connection


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_login_saves_a_user_only_file_and_later_commands_use_it(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    result = cli("login", "--url", live.url, "--token", live.api.admin_token, token=None)
    assert result.exit_code == 0, result.output
    assert f"logged in to {live.url} as admin (cluster admin; tenants: default (admin))" in (
        result.stdout
    )
    path = tmp_path / "config" / "trainhub" / "credentials.json"
    assert credentials_path() == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": live.url, "token": live.api.admin_token}
    # no TRAINHUB_URL, no TRAINHUB_TOKEN: the saved login is used
    from typer.testing import CliRunner

    from trainhub.cli.main import app

    whoami = CliRunner().invoke(app, ["whoami"])
    assert whoami.exit_code == 0, whoami.output
    assert whoami.stdout.startswith("admin (cluster admin")
    assert f"server {live.url} (from {path})" in whoami.stdout
    assert cli("logout").stdout.startswith("removed")
    assert not path.exists()


def test_login_prompts_for_the_token_and_keeps_nothing_when_it_is_refused(
    cli: Cli, live: LiveServer
) -> None:
    from typer.testing import CliRunner

    from trainhub.cli.main import app

    result = CliRunner().invoke(app, ["login", "--url", live.url], input="th_wrong\n")
    assert result.exit_code == 2
    assert "the API token is not valid" in result.stderr
    assert "th_wrong" not in result.output
    assert not credentials_path().exists()


def test_a_saved_token_is_only_sent_to_its_own_server(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainhub.client import save_credentials

    save_credentials(live.url, "th_saved")
    assert resolve_connection().token == "th_saved"
    monkeypatch.setenv("TRAINHUB_URL", "http://elsewhere:8080")
    assert resolve_connection().token is None
    monkeypatch.setenv("TRAINHUB_TOKEN", "th_env")
    connection = resolve_connection()
    assert (connection.url, connection.token) == ("http://elsewhere:8080", "th_env")
    assert connection.token_source == "TRAINHUB_TOKEN"


def test_an_unreachable_server_says_how_to_start_one() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for args in (["ls"], ["show", "1"], ["whoami"], ["tenants", "ls"], ["logs", "1", "-f"]):
        result = Cli(url, "th_x")(*args)
        assert result.exit_code == 1, (args, result.output)
        assert (
            f"cannot reach trainhub at {url}: start it with `trainhub server` or set TRAINHUB_URL"
            in result.stderr
        )
        assert "connection refused" in result.stderr


def test_401_says_how_to_log_in(cli: Cli, live: LiveServer) -> None:
    missing = cli("ls", token=None)
    assert missing.exit_code == 2
    assert "no API token was given" in missing.stderr
    assert f"no API token is set for {live.url}" in missing.stderr
    assert f"trainhub login --url {live.url} --token TOKEN" in missing.stderr
    wrong = cli("ls", token="th_not_a_real_token")
    assert wrong.exit_code == 2
    assert "the API token is not valid" in wrong.stderr
    assert "the token from TRAINHUB_TOKEN was refused" in wrong.stderr


def test_the_admin_token_file_of_a_local_server_is_mentioned(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "admin-token").write_text("th_x\n")
    result = cli("ls", token=None)
    assert f"saved its first admin token in {home / 'admin-token'}" in result.stderr


def test_help_and_no_arguments() -> None:
    from typer.testing import CliRunner

    from trainhub.cli.main import app

    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("submit", "ls", "show", "logs", "cancel", "metrics", "server", "login"):
        assert command in result.stdout
    assert CliRunner().invoke(app, ["submit", "--help"]).exit_code == 0
