"""The experiments list and the usage page follow live (server-sent events): a submission
appears on an open, filtered list; usage recorded meanwhile updates the numbers; the streams
hold nothing of another tenant."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.test_auth import submit
from tests.web.conftest import Site
from tests.web.test_dashboard import _login
from tests.web.test_experiment_live import _session
from trainhub.core.states import TrialState
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial

pytestmark = pytest.mark.browser


def _spec(name: str, project: str) -> str:
    return f"name: {name}\nproject: {project}\nentrypoint: python train.py\n"


def _used(site: Site, trial_id: int, slots: int, hours: float) -> None:
    """A finished attempt that held ``slots`` for ``hours`` in the last hours (as the
    scheduler records one)."""
    now = site.api.services.clock()
    with site.api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        attempt = repo.add_attempt(
            trial_id, 1, f"t{trial_id}-a1", ["n"], None, None, now - 7200, num_slots=slots
        )
        ended = now - 7200 + hours * 3600
        repo.update_attempt(attempt.id, AttemptUpdate(ended_at=ended, outcome="SUCCEEDED"))


def test_a_submission_appears_on_the_open_filtered_list(browser: Any, site: Site) -> None:
    api = site.api
    uma = api.user("uma", "lists")
    assert submit(api, uma, _spec("before", "live")).status_code == 201
    page = _login(browser, site, uma)
    page.goto(f"{site.url}/ui/experiments?project=live")
    page.wait_for_function("document.body.dataset.live === 'sse'")
    stream = page.get_attribute("#experiments-list", "data-live") or ""
    assert "project=live" in stream
    assert "page=1" in stream
    page.evaluate("window.notReloaded = true")
    assert submit(api, uma, _spec("elsewhere", "other")).status_code == 201
    assert submit(api, uma, _spec("arrives-live", "live")).status_code == 201
    page.wait_for_selector("#experiments a:text('arrives-live')", timeout=10_000)
    assert page.evaluate("window.notReloaded") is True
    assert page.inner_text("#experiments-count") == "2"
    assert "elsewhere" not in page.inner_text("#experiments")  # the filter holds
    page.screenshot(path=str(site.screenshots / "experiments-live.png"), full_page=True)
    page.close()


def test_the_usage_page_follows_new_usage(browser: Any, site: Site) -> None:
    api = site.api
    vic = api.user("vic", "usagelive")
    trial_id = submit(api, vic).json()["trials"][0]["id"]
    page = _login(browser, site, vic)
    page.goto(f"{site.url}/ui/usage")
    page.wait_for_function("document.body.dataset.live === 'sse'")
    cell = "#shares tr[data-tenant='usagelive'] .slot-hours"
    assert page.inner_text(cell) == "0"
    page.evaluate("window.notReloaded = true")
    _used(site, trial_id, slots=2, hours=1.0)
    page.wait_for_function(
        f"document.querySelector(\"{cell}\")?.textContent === '2'", timeout=15_000
    )
    assert page.evaluate("window.notReloaded") is True
    assert "vic" in page.inner_text("#usage")
    chart = json.loads(page.get_attribute("#usage-chart", "data-chart") or "{}")
    # between 01:00 and 02:00 UTC the attempt (2 h to 1 h ago) spans two days, each shown to 4
    # significant digits (1.235 + 0.7654): the days sum to 2 within that rounding
    assert sum(chart["series"]["usagelive"]["y"]) == pytest.approx(2.0, abs=2e-3)
    page.screenshot(path=str(site.screenshots / "usage-live.png"), full_page=True)
    page.close()


def _first_event(client: Any, path: str) -> tuple[str, dict[str, Any]]:
    with client.stream("GET", path) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines).startswith("retry:")
        assert next(lines) == ""
        name = next(lines).removeprefix("event: ")
        return name, json.loads(next(lines).removeprefix("data: "))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_list_streams_hold_nothing_of_another_tenant(site: Site) -> None:
    api = site.api
    wes, xia = api.user("wes", "secretlab"), api.user("xia", "openlab")
    hidden = submit(api, wes, _spec("hidden-run", "classified")).json()
    _used(site, hidden["trials"][0]["id"], slots=4, hours=1.0)
    assert submit(api, xia, _spec("own-run", "classified")).status_code == 201
    client = _session(site, xia)
    try:
        for path in ("/ui/experiments/events", "/ui/experiments/events?project=classified"):
            name, data = _first_event(client, path)
            assert name == "experiments"
            assert "own-run" in data["html"]  # the stream does show the caller's own
            assert data["count"] == 1
            polled = client.get(path, params={"once": 1}).json()["events"]
            for text in (json.dumps(data), json.dumps(polled)):
                assert "hidden-run" not in text
                assert "secretlab" not in text
                assert "<td>wes</td>" not in text
        name, data = _first_event(client, "/ui/usage/events")
        assert name == "usage"
        polled = client.get("/ui/usage/events", params={"once": 1}).json()["events"]
        for text in (json.dumps(data), json.dumps(polled)):
            assert "openlab" in text
            assert "secretlab" not in text
            assert "<td>wes</td>" not in text
        # the page's own checks: a state that does not exist
        bad = client.get("/ui/experiments/events", params={"state": "NOPE", "once": 1})
        assert bad.status_code == 404
        too_long = client.get("/ui/experiments/events", params={"name": "x" * 65})
        assert too_long.status_code == 422
    finally:
        client.close()
    anonymous = httpx.get(f"{site.url}/ui/usage/events")
    assert anonymous.status_code == 401
