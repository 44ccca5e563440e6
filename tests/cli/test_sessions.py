"""`trainhub notebook`, `trainhub tensorboard`, `trainhub sessions` and `trainhub sessions stop`
against a live API (no Ray: a session stays queued; serving is tested in
tests/web/test_session_proxy.py and tests/e2e/test_sessions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Cli, LiveServer
from trainhub.adapters.db.session_store import SqlSessionLimitStore
from trainhub.service.sessions import SessionService


@pytest.fixture(autouse=True)
def sessions(live: LiveServer) -> SessionService:
    services = live.api.services
    engine = services.uow.engine  # type: ignore[attr-defined]
    services.sessions = SessionService(
        services.uow, SqlSessionLimitStore(engine), services.experiments, services.clock, b"k"
    )
    return services.sessions


def test_a_notebook_is_queued_listed_and_stopped(cli: Cli, tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("einops==0.8.1\n")
    started = cli("notebook", "--wait", "0", "--idle-timeout", "45m", "--env", str(requirements))
    assert started.exit_code == 0, started.output
    assert "session 1 (notebook) queued" in started.output
    assert "/ui/sessions/1/server/lab" in started.output
    listed = cli("sessions")
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if line.strip().startswith("1"))
    assert "notebook" in row
    assert "QUEUED" in row
    stopped = cli("sessions", "stop", "1")
    assert stopped.exit_code == 0, stopped.output
    assert "CANCELED" in stopped.output
    assert "no sessions" in cli("sessions").output
    assert "CANCELED" in cli("sessions", "--all").output


def test_bad_session_options_exit_2_with_what_to_fix(cli: Cli, live: LiveServer) -> None:
    bad = cli("notebook", "--idle-timeout", "soon", "--wait", "0")
    assert bad.exit_code == 2
    assert "30m" in bad.output
    assert cli("notebook", "--gpus", "99", "--wait", "0").exit_code == 2
    r = live.api.client.put(
        "/api/v1/tenants/default/session-limits",
        json={"max_gpus": 1},
        headers=live.api.headers(),
    )
    assert r.status_code == 200, r.text
    refused = cli("notebook", "--gpus", "2", "--wait", "0")
    assert refused.exit_code == 2
    assert "at most 1" in refused.output
    assert cli("sessions", "stop", "77").exit_code == 2
    assert cli("tensorboard", "trial/4242", "--wait", "0").exit_code == 2
