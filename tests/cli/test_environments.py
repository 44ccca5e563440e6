"""`trainhub envs`, `trainhub envs rm` and `trainhub logs TRIAL --env` against a live API whose
environment records are written through the real store (the builds themselves are tested in
tests/service/test_environments.py and tests/e2e/test_environments.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, LiveServer
from trainhub.adapters.db.environment_store import SqlEnvironmentStore
from trainhub.adapters.envs.uv import UvEnvironments
from trainhub.service.environments import EnvironmentService

KEY = "ab12cd34ef" + "0" * 54
REQUEST = "fe" * 32


@pytest.fixture
def envs(live: LiveServer, tmp_path: Path) -> SqlEnvironmentStore:
    services = live.api.services
    engine = services.uow.engine  # type: ignore[attr-defined]
    store = SqlEnvironmentStore(engine)
    services.environments = EnvironmentService(
        services.uow, store, UvEnvironments(tmp_path / "envs"), services.clock
    )
    return store


def _trial_with_environment(live: LiveServer, store: SqlEnvironmentStore) -> int:
    spec = json.dumps({"name": "e", "entrypoint": "python -m somewhere", "max_restarts": 0})
    r = live.api.client.post("/api/v1/experiments", data={"spec": spec}, headers=live.api.headers())
    assert r.status_code == 201, r.text
    body = r.json()
    store.link(body["id"], REQUEST)
    store.begin(REQUEST, ["inflection==0.5.1"], 1.0)
    store.finish(REQUEST, KEY, ["inflection==0.5.1"], 56_000, "+ inflection==0.5.1", 1.2, True, 2.0)
    store.use(REQUEST, ["node-abcdef123456789"], 3.0)
    return int(body["trials"][0]["id"])


def test_envs_lists_and_admins_remove(
    cli: Cli, live: LiveServer, envs: SqlEnvironmentStore
) -> None:
    trial_id = _trial_with_environment(live, envs)
    listed = cli("envs")
    assert listed.exit_code == 0, listed.output
    assert KEY[:12] in listed.output
    assert "inflection==0.5.1" in listed.output
    assert "55 KiB" in listed.output
    assert "node-abcdef1" in listed.output

    logged = cli("logs", str(trial_id), "--env")
    assert logged.exit_code == 0, logged.output
    assert "+ inflection==0.5.1" in logged.output

    member = live.api.user("mia", "default")
    refused = cli("envs", "rm", KEY[:12], token=member)
    assert refused.exit_code != 0
    assert "admin" in refused.output

    busy = cli("envs", "rm", KEY[:12])  # its trial is still queued
    assert busy.exit_code != 0
    assert "queued or running trial" in busy.output

    live.api.client.post(f"/api/v1/trials/{trial_id}/cancel", headers=live.api.headers())
    removed = cli("envs", "rm", KEY[:12])
    assert removed.exit_code == 0, removed.output
    assert f"removed environment {KEY[:12]}" in removed.output
    assert "no environments cached" in cli("envs").output


def test_logs_env_of_a_trial_without_one_says_so(cli: Cli, live: LiveServer, envs: object) -> None:
    spec = json.dumps({"name": "plain", "entrypoint": "python -m x"})
    r = live.api.client.post("/api/v1/experiments", data={"spec": spec}, headers=live.api.headers())
    trial_id = r.json()["trials"][0]["id"]
    result = cli("logs", str(trial_id), "--env")
    assert result.exit_code != 0
    assert "platform's environment" in result.output
