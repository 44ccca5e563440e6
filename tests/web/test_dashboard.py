"""The dashboard in a real Chromium: log in, watch a trial's metrics and logs arrive, pause and
resume, and a viewer of another tenant gets 404s. Screenshots go to the site's folder."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.api.test_auth import submit
from tests.web.conftest import Site
from trainhub.core.states import TrialState
from trainhub.service.auth import new_token
from trainhub.service.keys import log_key
from trainhub.service.records import TrialUpdate
from trainhub.service.trial_writes import write_trial

pytestmark = pytest.mark.browser


def _login(browser: Any, site: Site, token: str) -> Any:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(f"{site.url}/ui/")
    assert "/ui/login" in page.url
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/ui/experiments$"))
    return page


def _running_trial(site: Site, token: str) -> tuple[int, int, dict[str, str]]:
    """Submit an experiment; give its trial a running 2-rank attempt; return its trial token."""
    api = site.api
    r = submit(api, token)
    assert r.status_code == 201, r.text
    experiment_id = r.json()["id"]
    trial_id = r.json()["trials"][0]["id"]
    secret, token_hash, prefix = new_token()
    with api.services.uow() as repo:
        row = repo.add_token(token_hash, prefix, "trial", 0.0, trial_id=trial_id)
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=1.0))
        repo.add_attempt(trial_id, 1, f"t{trial_id}-a1", ["node-a", "node-b"], None, row.id, 1.0)
    return experiment_id, trial_id, api.headers(secret)


def _report(site: Site, trial_id: int, headers: dict[str, str], steps: range) -> None:
    points = [{"step": s, "values": {"loss": 2.0 / (1 + s), "acc": s / (s + 5)}} for s in steps]
    r = site.api.client.post(
        f"/api/v1/trials/{trial_id}/metrics", json={"points": points}, headers=headers
    )
    assert r.status_code == 200, r.text


def test_log_in_follow_a_trial_pause_and_resume(browser: Any, site: Site) -> None:
    api = site.api
    alice = api.user("alice", "vision")
    experiment_id, trial_id, trial_headers = _running_trial(site, alice)
    _report(site, trial_id, trial_headers, range(0, 50))
    tenant = "vision"
    api.store.put(log_key(tenant, trial_id, 1, 0), b"rank 0 says hello\n")
    api.store.put(log_key(tenant, trial_id, 1, 1), b"rank 1 starts\n")

    page = _login(browser, site, alice)
    page.wait_for_selector(f"#experiments a[href='/ui/experiments/{experiment_id}']")
    page.screenshot(path=str(site.screenshots / "experiments.png"), full_page=True)

    page.goto(f"{site.url}/ui/trials/{trial_id}")
    page.wait_for_selector("canvas.chart[data-metric=loss]")
    assert page.inner_text("#points") == "50 points"
    # live: new points and new output arrive without a reload
    _report(site, trial_id, trial_headers, range(50, 120))
    page.wait_for_function("document.getElementById('points').textContent === '120 points'")
    page.wait_for_function("document.getElementById('log').textContent.includes('hello')")
    api.store.write_at(log_key(tenant, trial_id, 1, 0), 18, b"step 120 done\n")
    page.wait_for_function("document.getElementById('log').textContent.includes('step 120')")
    page.click("button.rank[data-rank='1']")
    page.wait_for_function("document.getElementById('log').textContent.includes('rank 1 starts')")
    assert "hello" not in page.inner_text("#log")
    assert "node-a, node-b" in page.inner_text("#attempts")
    page.screenshot(path=str(site.screenshots / "trial.png"), full_page=True)

    page.goto(f"{site.url}/ui/experiments/{experiment_id}")
    page.wait_for_function("document.getElementById('curves').dataset.drawn")
    page.screenshot(path=str(site.screenshots / "experiment.png"), full_page=True)
    page.click("form[action$='/pause'] button")
    page.wait_for_url(f"{site.url}/ui/experiments/{experiment_id}")
    # a running trial checkpoints and stops first: its runtime is told to stop
    assert "PREEMPTING" in page.inner_text("#trials")
    signals = api.client.get(f"/api/v1/trials/{trial_id}/signals", headers=trial_headers).json()
    assert signals["should_stop"] is True
    with api.services.uow() as repo:  # what the control loop does once the attempt ended
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.PAUSED))
    page.reload()
    assert "PAUSED" in page.inner_text("#trials")
    page.screenshot(path=str(site.screenshots / "experiment-paused.png"), full_page=True)
    page.click("form[action$='/resume'] button")
    page.wait_for_url(f"{site.url}/ui/experiments/{experiment_id}")
    assert "QUEUED" in page.inner_text("#trials")
    # the same from the trial's own page (queued: it parks at once)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    page.click("form[action$='/pause'] button")
    page.wait_for_url(f"{site.url}/ui/trials/{trial_id}")
    assert page.inner_text("#trial-state") == "PAUSED"
    page.click("form[action$='/resume'] button")
    page.wait_for_url(f"{site.url}/ui/trials/{trial_id}")
    assert page.inner_text("#trial-state") == "QUEUED"

    page.goto(f"{site.url}/ui/queue")
    page.screenshot(path=str(site.screenshots / "queue.png"), full_page=True)
    page.goto(f"{site.url}/ui/usage")
    assert page.get_attribute("#usage-csv", "href") == "/ui/usage.csv"
    assert page.locator("canvas#usage-chart").count() == 1
    csv = page.request.get(f"{site.url}/ui/usage.csv")
    assert csv.status == 200
    assert csv.text().startswith("day,tenant,user,project,slot_hours")
    page.screenshot(path=str(site.screenshots / "usage.png"), full_page=True)

    # a form without the session's CSRF token is refused
    forged = page.request.post(
        f"{site.url}/ui/experiments/{experiment_id}/resume", form={"csrf": "guess"}
    )
    assert forged.status == 403
    page.close()


def test_a_viewer_of_another_tenant_gets_404(browser: Any, site: Site) -> None:
    api = site.api
    carol = api.user("carol", "vision")
    experiment_id, trial_id, _ = _running_trial(site, carol)
    bob = api.user("bob", "audio", role="viewer")
    page = _login(browser, site, bob)
    assert f"/ui/experiments/{experiment_id}" not in page.content()
    for path in (f"/ui/experiments/{experiment_id}", f"/ui/trials/{trial_id}"):
        response = page.goto(f"{site.url}{path}")
        assert response is not None
        assert response.status == 404, path
    page.screenshot(path=str(site.screenshots / "not-found.png"), full_page=True)
    chart = page.request.get(f"{site.url}/ui/trials/{trial_id}/chart.json")
    assert chart.status == 404
    page.close()


def test_without_a_session_pages_redirect_to_login(site: Site) -> None:
    r = site.api.client.get("/ui/experiments", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/ui/login")
    bad = site.api.client.get("/ui/login")
    assert "httponly" in bad.headers["set-cookie"].lower()


def test_a_malformed_or_unknown_address_gets_a_page_and_the_api_keeps_json(site: Site) -> None:
    client = site.api.client
    html = {"Accept": "text/html,application/xhtml+xml"}
    malformed = client.get("/ui/experiments/abc", headers=html)
    assert malformed.status_code == 422
    assert malformed.headers["content-type"].startswith("text/html")
    assert 'role="alert"' in malformed.text
    assert "whole numbers" in malformed.text
    unknown = client.get("/ui/no-such-page", headers=html)
    assert unknown.status_code == 404
    assert "/ui/experiments" in unknown.text
    assert unknown.headers["content-type"].startswith("text/html")
    # a page's script (no text/html in Accept) and the API still get JSON bodies
    assert client.get("/ui/trials/abc/chart.json").json()["code"] == "invalid_request"
    api = client.get("/api/v1/experiments/abc", headers=html)
    assert api.headers["content-type"] == "application/json"
    assert api.json()["code"]


def test_a_wrong_token_is_refused_with_a_message(site: Site) -> None:
    client = site.api.client
    form = client.get("/ui/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf is not None
    r = client.post(
        "/ui/login", data={"token": "th_wrong", "csrf": csrf.group(1)}, follow_redirects=False
    )
    assert r.status_code == 401
    assert 'role="alert"' in r.text
    assert "trainhub_session" not in r.headers.get("set-cookie", "")


def test_the_experiments_list_filters_by_project_and_name(site: Site) -> None:
    from fastapi.testclient import TestClient

    api = site.api
    dave = api.user("dave", "speech")
    for name, project in (("asr-small", "asr"), ("asr-large", "asr"), ("tts-base", "tts")):
        spec = f"name: {name}\nproject: {project}\nentrypoint: python train.py\n"
        assert submit(api, dave, spec).status_code == 201
    with TestClient(api.client.app) as browserless:
        form = browserless.get("/ui/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        r = browserless.post("/ui/login", data={"token": dave, "csrf": csrf.group(1)})
        assert r.status_code == 200
        page = browserless.get("/ui/experiments", params={"project": "asr"}).text
        assert "asr-small" in page
        assert "asr-large" in page
        assert "tts-base" not in page
        page = browserless.get("/ui/experiments", params={"name": "large"}).text
        assert "asr-large" in page
        assert "asr-small" not in page
        # the %/_ of a LIKE pattern are taken literally
        assert "No experiments." in browserless.get("/ui/experiments", params={"name": "%"}).text
