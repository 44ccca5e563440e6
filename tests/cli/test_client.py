"""The Python client on its own: errors as exceptions with the API's fields, waiting on trials."""

from __future__ import annotations

import httpx
import pytest

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import finish, start, submit
from tests.fixtures.api import make_context
from trainhub.client import ApiError, ServerUnreachable, TrainhubClient, save_credentials


def test_a_bad_spec_raises_api_error_with_field_paths(live: LiveServer) -> None:
    with (
        TrainhubClient(live.url, live.api.admin_token) as client,
        pytest.raises(ApiError) as info,
    ):
        client.submit_experiment(
            "name: demo\nentrypoint: python train.py\nresources: {workers: 0}\n",
            make_context({"train.py": b""}),
        )
    error = info.value
    assert (error.status_code, error.code) == (422, "invalid_spec")
    assert "resources.workers" in [e["path"] for e in error.errors]
    assert error.hint


def test_server_side_field_errors_are_printed_by_the_cli(cli: Cli) -> None:
    result = cli("tenants", "create", "x", "--weight", "0")
    assert result.exit_code == 2
    assert "weight:" in result.stderr


def test_a_non_json_error_body_still_reads_well() -> None:
    transport = httpx.MockTransport(lambda _r: httpx.Response(502, text="<html>Bad Gateway</html>"))
    with TrainhubClient("proxy:8080", "t", transport=transport) as client:
        assert client.url == "http://proxy:8080"
        with pytest.raises(ApiError, match=r"HTTP 502: <html>Bad Gateway</html>") as info:
            client.me()
    assert info.value.code == "http_error"


def test_unreachable_raises_server_unreachable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with (
        TrainhubClient(transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(ServerUnreachable) as info,
    ):
        client.list_experiments()
    assert info.value.reason == "connection refused"
    assert info.value.url == "http://127.0.0.1:8080"


def test_from_env_and_wait_for_trial(live: LiveServer) -> None:
    save_credentials(live.url, live.api.admin_token)
    trial_id = submit(live)["trial_ids"][0]
    with TrainhubClient.from_env() as client:
        assert client.me()["username"] == "admin"
        with pytest.raises(TimeoutError, match="still QUEUED"):
            client.wait_for_trial(trial_id, poll_interval_s=0.01, timeout_s=0.05)
        finish(live, trial_id, start(live, trial_id))
        assert client.wait_for_trial(trial_id, poll_interval_s=0.01)["state"] == "COMPLETED"
        assert [t["state"] for t in client.watch_trial(trial_id)] == ["COMPLETED"]


def test_a_timeout_is_not_reported_as_a_missing_server() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with (
        TrainhubClient("http://busy:8080", timeout_s=2, transport=httpx.MockTransport(slow)) as c,
        pytest.raises(ServerUnreachable) as info,
    ):
        c.me()
    assert info.value.timed_out
    assert info.value.reason == "no answer within 2 s"
