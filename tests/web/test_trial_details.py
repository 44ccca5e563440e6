"""The trial page's "where the time goes" table (live), attempts on a timeline and layer-health
alerts, and the experiment page's best-so-far curve, in a real Chromium."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.api.test_auth import submit
from tests.web.conftest import Site
from tests.web.test_dashboard import _login
from tests.web.test_experiment_live import _acc, _search, _start
from trainhub.core.states import TrialState
from trainhub.service.auth import new_token
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial

pytestmark = pytest.mark.browser

TIMING = {
    "time/forward_share": 0.5,
    "time/backward_share": 0.3,
    "time/data_share": 0.2,
    "time/step_s": 0.1,
    "comm/allreduce_bytes": 3 * 1024 * 1024,
    "throughput/samples_per_s": 1234.5,
}


def _trial_with_three_attempts(site: Site, token: str) -> tuple[int, dict[str, str]]:
    """A trial whose first attempt was preempted, second lost, third runs; the third's token."""
    api = site.api
    trial_id = submit(api, token).json()["trials"][0]["id"]
    now = time.time()
    secret, token_hash, prefix = new_token()
    with api.services.uow() as repo:
        row = repo.add_token(token_hash, prefix, "trial", 0.0, trial_id=trial_id)
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=now - 300))
        ended = [
            ("PREEMPTED", "node-a", 300, 200, "preempted"),
            ("LOST", "node-b", 180, 120, "node died"),
        ]
        for number, (outcome, node, start, end, detail) in enumerate(ended, start=1):
            a = repo.add_attempt(
                trial_id, number, f"t{trial_id}-a{number}", [node], None, None, now - start
            )
            update = AttemptUpdate(
                outcome=outcome, detail=detail, started_at=now - start, ended_at=now - end
            )
            repo.update_attempt(a.id, update)
        a = repo.add_attempt(
            trial_id, 3, f"t{trial_id}-a3", ["node-c", "node-d"], None, row.id, now - 100
        )
        repo.update_attempt(a.id, AttemptUpdate(started_at=now - 100))
    return trial_id, api.headers(secret)


def _post(
    site: Site, trial_id: int, headers: dict[str, str], step: int, values: dict[str, Any]
) -> None:
    r = site.api.client.post(
        f"/api/v1/trials/{trial_id}/metrics",
        json={"points": [{"step": step, "values": values}]},
        headers=headers,
    )
    assert r.status_code == 200, r.text


def test_the_trial_page_shows_step_timing_attempts_on_a_timeline_and_alerts(
    browser: Any, site: Site
) -> None:
    ines = site.api.user("ines", "vision")
    trial_id, own = _trial_with_three_attempts(site, ines)
    healthy = {"loss": 1.0, "layers/fc1/grad_norm": 0.5, "layers/fc2/grad_norm": 0.4}
    _post(site, trial_id, own, 0, {**healthy, **TIMING})
    _post(site, trial_id, own, 10, {**healthy, "layers/fc2/grad_norm": 4e4, **TIMING})

    from trainhub.core.isolation import NodeIsolation

    site.api.services.experiments.isolation = NodeIsolation()
    page = _login(browser, site, ines)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    limits = page.inner_text("#limits")  # what contains each rank, as `trainhub show`
    assert "processes\t512" in limits
    assert "seccomp" in limits
    phases = page.eval_on_selector_all(
        "#timing-table tr.phase", "rs => rs.map(r => r.dataset.phase)"
    )
    assert phases == ["forward", "backward", "data"]  # largest share first, as the CLI
    forward = page.inner_text("#timing-table tr[data-phase=forward]")
    assert "50.0 %" in forward
    assert "50.0" in forward.split("%")[1]
    width = page.eval_on_selector("tr[data-phase=forward] .sharebar", "e => e.style.width")
    assert width == "50%"
    others = page.inner_text("#timing-table")
    assert "100.0 ms" in others
    assert "3.0 MB" in others
    assert "comm/allreduce_bytes" in others

    # one bar per attempt, coloured by outcome, labelled with its nodes and exit reason
    bars = page.eval_on_selector_all(
        "#attempt-timeline .tbar", "bs => bs.map(b => [b.dataset.attempt, b.className])"
    )
    assert bars == [["1", "tbar PREEMPTED"], ["2", "tbar LOST"], ["3", "tbar RUNNING"]]
    labels = page.inner_text("#attempt-timeline")
    assert "node-a · PREEMPTED: preempted" in labels
    assert "node-c, node-d · running" in labels
    lefts = page.eval_on_selector_all(
        "#attempt-timeline .tbar", "bs => bs.map(b => b.getBoundingClientRect().left)"
    )
    assert lefts == sorted(lefts)
    assert lefts[0] < lefts[2]
    assert page.locator("#attempts tbody tr").count() == 3  # the table stays under it

    rows = page.eval_on_selector_all(
        "#alerts tbody tr", "rs => rs.map(r => Array.from(r.cells, c => c.textContent))"
    )
    assert len(rows) == 1
    assert rows[0][:3] == ["10", "fc2", "exploding_gradients"]
    assert "fc2" in rows[0][3]
    page.screenshot(path=str(site.screenshots / "trial-details.png"), full_page=True)

    # live: new shares arrive with the chart's stream and reorder the table without a reload
    page.wait_for_function("document.body.dataset.live === 'sse'")
    shifted = {
        **TIMING,
        "time/data_share": 0.6,
        "time/forward_share": 0.25,
        "time/backward_share": 0.15,
    }
    _post(site, trial_id, own, 20, {**healthy, **shifted})
    page.wait_for_function(
        "document.querySelector('#timing-table tr.phase').dataset.phase === 'data'"
    )
    page.close()


def test_a_trial_without_timing_or_alerts_says_so(browser: Any, site: Site) -> None:
    ines = site.api.user("ines", "vision")
    trial_id = submit(site.api, ines).json()["trials"][0]["id"]
    page = _login(browser, site, ines)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    assert "No step timing yet" in page.inner_text("#trial-timing")
    assert page.locator("#alerts").count() == 0
    assert page.locator("#attempt-timeline .tbar").count() == 0
    page.close()


def test_the_experiment_page_draws_the_best_so_far(browser: Any, site: Site) -> None:
    api = site.api
    olga = api.user("olga", "vision")
    experiment_id, trial_ids = _search(site, olga)
    runtimes = {t: _start(site, t) for t in trial_ids}
    # finishing order 2, 0, 3; their values 0.6, 0.5, 0.8 (acc, max): best 0.6, 0.6, 0.8
    finished = [(trial_ids[2], 0.6, 100.0), (trial_ids[0], 0.5, 200.0), (trial_ids[3], 0.8, 300.0)]
    for trial_id, acc, _ in finished:
        _acc(site, trial_id, runtimes[trial_id], acc)
    with api.services.uow() as repo:
        for trial_id, _, ended_at in finished:
            write_trial(repo, trial_id, TrialUpdate(state=TrialState.COMPLETED, ended_at=ended_at))

    page = _login(browser, site, olga)
    page.goto(f"{site.url}/ui/experiments/{experiment_id}")
    page.wait_for_function("document.getElementById('best-so-far').dataset.drawn === '3'")
    data = page.evaluate("JSON.parse(document.getElementById('best-so-far').dataset.chart)")
    assert data["trials"] == [t for t, _, _ in finished]
    assert data["values"] == pytest.approx([0.6, 0.5, 0.8])
    assert data["best"] == pytest.approx([0.6, 0.6, 0.8])
    assert all(a <= b for a, b in zip(data["best"], data["best"][1:], strict=False))
    # live: the still-running trial's value arrives and joins the curve last
    page.wait_for_function("document.body.dataset.live === 'sse'")
    _acc(site, trial_ids[1], runtimes[trial_ids[1]], 0.9)
    page.wait_for_function("document.getElementById('best-so-far').dataset.drawn === '4'")
    data = page.evaluate("JSON.parse(document.getElementById('best-so-far').dataset.chart)")
    assert data["best"] == pytest.approx([0.6, 0.6, 0.8, 0.9])
    page.screenshot(path=str(site.screenshots / "experiment-best-so-far.png"), full_page=True)
    page.close()
