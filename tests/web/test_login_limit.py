"""The dashboard's login has the API's failed-authentication limit: a flood of wrong tokens
is slowed (429), and a valid token logs in at once from the same address (issue 24)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from tests.api.conftest import build_bounded_api


def _csrf(client: TestClient) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/login").text)
    assert found is not None
    return found.group(1)


def test_a_valid_token_logs_in_during_a_flood_of_wrong_ones(tmp_path: Path) -> None:
    api = build_bounded_api(tmp_path)
    try:
        with TestClient(api.client.app) as client:
            codes = []
            for i in range(22):
                r = client.post("/ui/login", data={"token": f"th_wrong{i}", "csrf": _csrf(client)})
                codes.append(r.status_code)
            assert codes[:20] == [401] * 20
            assert codes[20:] == [429, 429]
            assert "too many failed logins" in r.text
            r = client.post("/ui/login", data={"token": api.admin_token, "csrf": _csrf(client)})
            assert r.status_code == 200, r.text[:300]
            assert r.url.path != "/ui/login"  # redirected to the dashboard, logged in
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]
