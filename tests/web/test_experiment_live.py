"""The experiment page's parallel coordinates and clone form, trial charts' zoom, and live
updates by server-sent events (delivered, bounded per session, 404 for another tenant)."""

from __future__ import annotations

import contextlib
import gzip
import json
import re
from typing import Any

import httpx
import pytest

from tests.api.test_auth import submit
from tests.web.conftest import Site
from tests.web.test_dashboard import _login, _running_trial
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.core import limits
from trainhub.core.states import TrialState
from trainhub.service.auth import new_token
from trainhub.service.records import TrialUpdate
from trainhub.service.search import SearchService
from trainhub.service.trial_writes import write_trial

pytestmark = pytest.mark.browser

SEARCH = """
name: lr-search
entrypoint: python train.py
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  width: {type: categorical, choices: [64, 128, 256]}
  epochs: 3
searcher: {sampler: random, metric: acc, mode: max, max_trials: 4, max_concurrent_trials: 4}
"""


def _start(site: Site, trial_id: int) -> dict[str, str]:
    """A running attempt and the trial's own token (its runtime's credentials)."""
    api = site.api
    secret, token_hash, prefix = new_token()
    with api.services.uow() as repo:
        row = repo.add_token(token_hash, prefix, "trial", 0.0, trial_id=trial_id)
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=1.0))
        repo.add_attempt(trial_id, 1, f"t{trial_id}-a1", ["node-a"], None, row.id, 1.0)
    return api.headers(secret)


def _acc(site: Site, trial_id: int, headers: dict[str, str], acc: float) -> None:
    points = [{"step": s, "values": {"acc": acc * (s + 1) / 3}} for s in range(3)]
    r = site.api.client.post(
        f"/api/v1/trials/{trial_id}/metrics", json={"points": points}, headers=headers
    )
    assert r.status_code == 200, r.text


def _search(site: Site, token: str) -> tuple[int, list[int]]:
    api = site.api
    r = submit(api, token, SEARCH)
    assert r.status_code == 201, r.text
    engine = api.services.uow.engine  # type: ignore[attr-defined]
    backend = OptunaSearch.for_database(str(engine.url))
    try:
        SearchService(SqlSearchUnitOfWork(engine), backend, api.store, api.services.clock).tick()
    finally:
        backend.storage.engine.dispose()
    experiment = api.client.get(f"/api/v1/experiments/{r.json()['id']}", headers=api.headers(token))
    return r.json()["id"], [t["id"] for t in experiment.json()["trials"]]


def test_parallel_coordinates_live_and_clone(browser: Any, site: Site) -> None:
    api = site.api
    hana = api.user("hana", "vision")
    experiment_id, trial_ids = _search(site, hana)
    assert len(trial_ids) == 4
    runtimes = {t: _start(site, t) for t in trial_ids}
    for k, trial_id in enumerate(trial_ids[:3]):
        _acc(site, trial_id, runtimes[trial_id], 0.5 + 0.1 * k)

    page = _login(browser, site, hana)
    page.goto(f"{site.url}/ui/experiments/{experiment_id}")
    page.wait_for_function("document.getElementById('parcoords').dataset.lines === '3'")
    axes = [a["name"] for a in _parcoords(page)["axes"]]
    # the varying hyperparameters, then the metric; the constant epochs has no axis
    assert axes[0] == "lr"
    assert axes[-1] == "acc"
    assert set(axes) <= {"lr", "width", "acc"}
    # the table too: epochs is said once above it, not a column of every trial
    assert "epochs=3" in page.inner_text("#fixed-hparams")
    headers = page.eval_on_selector_all("#trials thead th", "ths => ths.map(t => t.textContent)")
    assert "lr" in headers
    assert "epochs" not in headers
    # live: the fourth trial's metric arrives by a server-sent event, without a reload
    page.wait_for_function("document.body.dataset.live === 'sse'")
    _acc(site, trial_ids[3], runtimes[trial_ids[3]], 0.9)
    page.wait_for_function("document.getElementById('parcoords').dataset.lines === '4'")
    assert "0.9" in page.inner_text("#trials")
    page.screenshot(path=str(site.screenshots / "experiment-parcoords.png"), full_page=True)

    # clone with --set-like changes: a new experiment, its page opens
    page.click("details.clone summary")
    page.fill("#clone-form textarea[name=set]", "searcher.max_trials=2\nname=lr-search-small")
    page.click("#clone-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/ui/experiments/\d+$"))
    clone_id = int(page.url.rsplit("/", 1)[1])
    assert clone_id != experiment_id
    spec = api.client.get(f"/api/v1/experiments/{clone_id}", headers=api.headers(hana)).json()
    assert spec["name"] == "lr-search-small"
    page.goto(f"{site.url}/ui/experiments/{experiment_id}")
    page.click("details.clone summary")
    page.fill("#clone-form textarea[name=set]", "no equals sign here")
    page.click("#clone-form button[type=submit]")
    assert "is not PATH=VALUE" in page.inner_text("[role=alert]")
    page.close()


def _parcoords(page: Any) -> dict[str, Any]:
    return page.evaluate("JSON.parse(document.getElementById('parcoords').dataset.chart)")  # type: ignore[no-any-return]


def test_zoom_asks_the_server_for_the_detail_of_the_range(browser: Any, site: Site) -> None:
    api = site.api
    ivan = api.user("ivan", "vision")
    _, trial_id, headers = _running_trial(site, ivan)
    for first in range(0, 20_000, 1000):
        points = [
            {"step": s, "values": {"loss": 1.0 + (s % 7) / 10 + (5.0 if s == 10_500 else 0.0)}}
            for s in range(first, first + 1000)
        ]
        r = api.client.post(
            f"/api/v1/trials/{trial_id}/metrics", json={"points": points}, headers=headers
        )
        assert r.status_code == 200, r.text
    page = _login(browser, site, ivan)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    canvas = page.locator("canvas.chart[data-metric=loss]")
    canvas.wait_for()
    page.wait_for_function("document.getElementById('points').textContent === '20000 points'")
    everything = int(canvas.get_attribute("data-shown") or 0)
    assert everything <= 4 * 2000  # downsampled
    # drag across the middle tenth of the plot area: about steps 9,500 to 11,500
    box = canvas.bounding_box()
    assert box is not None
    plot_w = box["width"] - 60 - 10
    left = box["x"] + 60 + plot_w * 0.475
    right = box["x"] + 60 + plot_w * 0.575
    y = box["y"] + box["height"] / 2
    page.mouse.move(left, y)
    page.mouse.down()
    page.mouse.move((left + right) / 2, y)
    page.mouse.move(right, y)
    page.mouse.up()
    page.wait_for_function("document.getElementById('charts').dataset.zoom !== ''")
    x0, x1 = (int(v) for v in (page.get_attribute("#charts", "data-zoom") or "").split(","))
    assert 9_000 < x0 < 10_000
    assert 11_000 < x1 < 12_000
    # every point of the range is drawn now (fewer than 4 per bucket: nothing to drop)
    page.wait_for_function(
        f"Number(document.querySelector('canvas[data-metric=loss]').dataset.shown) >= {x1 - x0}"
    )
    page.check(".logscale")
    page.screenshot(path=str(site.screenshots / "trial-zoomed.png"), full_page=True)
    canvas.dblclick()
    page.wait_for_function("document.getElementById('charts').dataset.zoom === ''")
    assert int(canvas.get_attribute("data-shown") or 0) == everything
    page.close()


def _session(site: Site, token: str) -> httpx.Client:
    client = httpx.Client(base_url=site.url, timeout=10)
    form = client.get("/ui/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf is not None
    r = client.post("/ui/login", data={"token": token, "csrf": csrf.group(1)})
    assert r.status_code in (200, 303), r.text
    return client


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_streams_are_bounded_per_session_and_refuse_other_tenants(site: Site) -> None:
    api = site.api
    jo = api.user("jo", "vision")
    _, trial_id, _ = _running_trial(site, jo)
    path = f"/ui/trials/{trial_id}/events"
    client, other = _session(site, jo), _session(site, jo)
    try:
        with contextlib.ExitStack() as open_streams:
            for _ in range(limits.MAX_LIVE_STREAMS_PER_SESSION):
                r = open_streams.enter_context(client.stream("GET", path))
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
            refused = client.get(path)
            assert refused.status_code == 429
            assert "live pages are open" in refused.json()["message"]
            # another session is not affected; polling (once=1) takes no slot
            with other.stream("GET", path) as ok:
                assert ok.status_code == 200
                lines = ok.iter_lines()
                assert next(lines).startswith("retry:")
                assert next(lines) == ""
                assert next(lines) == "event: chart"
            polled = client.get(path, params={"once": 1})
            assert polled.status_code == 200
            assert {e["event"] for e in polled.json()["events"]} >= {"chart"}
    finally:
        client.close()
        other.close()
    experiment_id = site.api.client.get(
        f"/api/v1/trials/{trial_id}", headers=api.headers(jo)
    ).json()["experiment_id"]
    outsider = _session(site, api.user("kim", "audio", role="viewer"))
    try:
        assert outsider.get(path).status_code == 404
        assert outsider.get(path, params={"once": 1}).status_code == 404
        experiment_events = f"/ui/experiments/{experiment_id}/events"
        assert outsider.get(experiment_events, params={"once": 1}).status_code == 404
        page = outsider.get("/ui/experiments").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        clone = outsider.post(
            f"/ui/experiments/{experiment_id}/clone", data={"csrf": csrf.group(1), "set": "lr=1"}
        )
        assert clone.status_code == 404
    finally:
        outsider.close()
    assert httpx.get(f"{site.url}{path}").status_code == 401


def test_the_trial_page_profiles_and_shows_each_ranks_operators(browser: Any, site: Site) -> None:
    api = site.api
    lena = api.user("lena", "vision")
    _, trial_id, runtime = _running_trial(site, lena)
    page = _login(browser, site, lena)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    page.fill("#profile-form input[name=steps]", "7")
    page.click("#profile-form button")
    page.wait_for_url(re.compile(rf".*/ui/trials/{trial_id}(#profiles)?$"))
    assert "REQUESTED" in page.inner_text("#profiles")
    # the two ranks answer, as the runtime does (runtime/profiling.py)
    pending = api.client.get(f"/api/v1/trials/{trial_id}/profiles/pending", headers=runtime)
    profile = pending.json()["profile"]
    assert profile["steps"] == 7
    base = f"/api/v1/trials/{trial_id}/profiles/{profile['id']}/ranks"
    for rank in (0, 1):
        ops = [
            {"name": "aten::addmm", "calls": 14, "self_cpu_ms": 12.5 + rank, "cpu_total_ms": 13.0},
            {"name": "aten::relu", "calls": 7, "self_cpu_ms": 1.25, "cpu_total_ms": 1.5},
        ]
        r = api.client.post(f"{base}/{rank}", json={"top_ops": ops}, headers=runtime)
        assert r.status_code == 200, r.text
        trace = gzip.compress(json.dumps({"traceEvents": [{"name": "aten::addmm"}]}).encode())
        r = api.client.put(f"{base}/{rank}/trace", content=trace, headers=runtime)
        assert r.status_code == 200, r.text
    # live: the tables arrive without a reload
    page.wait_for_function("document.querySelector('#profiles .profile')?.dataset.state === 'DONE'")
    assert page.locator("#profiles table.profile-ops").count() == 2
    assert "aten::addmm" in page.inner_text("#profiles table.profile-ops[data-rank='1']")
    link = page.locator("#profiles table.profile-ops[data-rank='1'] a.trace")
    download = page.request.get(f"{site.url}{link.get_attribute('href')}")
    assert download.status == 200
    assert json.loads(gzip.decompress(download.body()))["traceEvents"]
    page.screenshot(path=str(site.screenshots / "trial-profile.png"), full_page=True)
    page.close()
    # another tenant's viewer reaches neither the trace nor the button
    page = _login(browser, site, api.user("mona", "audio", role="viewer"))
    trace_url = f"{site.url}/ui/trials/{trial_id}/profiles/{profile['id']}/ranks/0/trace"
    assert page.request.get(trace_url).status == 404
    csrf = page.locator("form.logout input[name=csrf]").get_attribute("value")
    refused = page.request.post(
        f"{site.url}/ui/trials/{trial_id}/profile", form={"csrf": csrf or "", "steps": "5"}
    )
    assert refused.status == 404
    page.close()


def test_the_queue_follows_new_submissions(browser: Any, site: Site) -> None:
    api = site.api
    nora = api.user("nora", "robots")
    page = _login(browser, site, nora)
    page.goto(f"{site.url}/ui/queue")
    page.wait_for_function("document.body.dataset.live === 'sse'")
    trial_id = submit(api, nora).json()["trials"][0]["id"]
    page.wait_for_selector(f"#queue a[href='/ui/trials/{trial_id}']")
    assert page.inner_text("#queue-count") == "1"
    page.screenshot(path=str(site.screenshots / "queue-live.png"), full_page=True)
    page.close()
