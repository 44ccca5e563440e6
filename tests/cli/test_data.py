"""`trainhub data` refuses bad input before it talks to a server: a message, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainhub.cli.main import app

# nothing listens there: a command that got past its checks would fail differently (exit 1)
ENV = {"TRAINHUB_URL": "http://127.0.0.1:9", "TRAINHUB_TOKEN": "th_x"}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["data", "push", "bad name", "."], "not a dataset name"),
        (["data", "push", "ok", "/no/such/folder"], "does not exist"),
        (["data", "show", "ok:latest"], "not a number"),
        (["data", "rm", "a/b/c"], "not a dataset name"),
        (["data", "share", "a.b/c/d", "teamb"], "not a dataset name"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], words: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "Traceback" not in result.output


def test_an_unreachable_server_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("a,label\n1,0\n")
    result = CliRunner().invoke(app, ["data", "push", "ok", str(tmp_path)], env=ENV)
    assert result.exit_code not in (0, 2)
    assert "Traceback" not in result.output
