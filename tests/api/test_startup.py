"""Rank 0's startup marks become the attempt's startup phases (an event `show` reads)."""

from __future__ import annotations

import time

from rich.console import Console

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api
from trainhub.cli.render import trial_view
from trainhub.core.startup import EVENT_KIND, parse_startup
from trainhub.service.records import TrialEvent
from trainhub.web.site import templates
from trainhub.web.startup import startup_context


def rank_marks(base: float) -> dict[str, float]:
    names = ["launched_at", "actor_at", "spawned_at", "process_at", "init_at"]
    marks = {name: base + 0.25 * i for i, name in enumerate(names)}
    marks["process_group_at"] = base + 1.5
    marks["first_step_at"] = base + 2.0
    return marks


def test_marks_become_phases_once_per_attempt(api: Api) -> None:
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    h = start_attempt(api, trial_id, 1)
    url = f"/api/v1/trials/{trial_id}/startup"
    body = {"attempt": 1, "marks": rank_marks(time.time()), "warm": True}
    assert api.client.post(url, json=body, headers=h).status_code == 204
    assert api.client.post(url, json=body, headers=h).status_code == 204  # a retry: no second
    trial = api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers(user)).json()
    events = [e for e in trial["events"] if e["kind"] == EVENT_KIND]
    assert len(events) == 1
    parsed = parse_startup(events[0]["message"])
    assert parsed is not None
    assert parsed.warm
    assert parsed.phases["environment"] == 0.25
    assert parsed.phases["process_group"] == 0.5
    assert parsed.phases["first_step"] == 0.5
    assert set(parsed.phases) >= {"queue", "admit", "place", "start", "import"}
    # `trainhub show --trial` and the trial page list it
    console = Console(width=160, record=True)
    console.print(trial_view(trial))
    shown = console.export_text()
    assert "startup" in shown
    assert "process-group init" in shown
    assert "attempt 1" in shown  # a column per attempt, the warm one marked under it
    assert "warm" in shown.split("attempt 1", 1)[1]
    records = [TrialEvent(e["time"], e["kind"], e["message"]) for e in trial["events"]]
    page = startup_context(records)
    assert [row.attempt for row in page["startups"]] == [1]
    assert ("process_group", "process-group init") in page["startup_phases"]
    html = templates.get_template("_trial_attempts.html").render(
        attempts=[], timeline=[], trial={"pending_reason": None}, **page
    )
    assert '<table class="grid" id="startup">' in html
    assert "<th>process-group init</th>" in html
    assert "1 (warm)" in html


def test_only_the_trials_runtime_reports_its_start_and_marks_are_checked(api: Api) -> None:
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    h = start_attempt(api, trial_id, 1)
    url = f"/api/v1/trials/{trial_id}/startup"
    body = {"attempt": 1, "marks": rank_marks(time.time())}
    assert api.client.post(url, json=body, headers=api.headers(user)).status_code == 403
    bad = {"attempt": 1, "marks": {"lunch_at": 1.0, "init_at": -5.0}}
    r = api.client.post(url, json=bad, headers=h)
    assert r.status_code == 422
    assert {e["path"] for e in r.json()["errors"]} == {"marks.lunch_at", "marks.init_at"}
    r = api.client.post(url, json={"attempt": 7, "marks": {}}, headers=h)
    assert r.status_code == 422
