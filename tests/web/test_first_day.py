"""What a new user sees first (issue 31): the bare URL opens the dashboard, titles are text,
charts draw from the page itself before any live event, the trial's own metrics come first in
a grid with the runtime's series folded under "system", nodes by hostname, only the actions
the state allows, human units. Screenshots go to the site's folder (a tmp path)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.api.test_auth import submit
from tests.web.conftest import Site
from tests.web.test_dashboard import _login
from tests.web.test_experiment_live import _acc, _search, _start
from tests.web.test_trial_details import TIMING
from trainhub.core.states import TrialState
from trainhub.service.auth import new_token
from trainhub.service.clock import system_clock
from trainhub.service.experiments import refresh_experiment_state
from trainhub.service.monitoring import NodeInventory, NodeSample
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial

pytestmark = pytest.mark.browser

# Ray's node ids are 56 hex characters; the agents report the hostnames
NODE_A = "a3f1" * 14
NODE_B = "9c0e" * 14
HOSTS = {NODE_A: "gpu-host-a", NODE_B: "gpu-host-b"}
USER_METRICS = ("acc", "loss", "lr", "val_acc", "val_loss")
SYSTEM = {**TIMING, "layers/fc1/grad_norm": 0.5, "layers/fc2/grad_norm": 0.4}


def _plant_hosts(site: Site) -> None:
    monitoring = site.api.services.monitoring
    assert monitoring is not None
    now = system_clock()
    inventory = {
        node: NodeInventory(
            node_id=node, hostname=host, cpu_model="AMD EPYC 7763", num_cores=64, memory_gb=503.8
        )
        for node, host in HOSTS.items()
    }
    samples = [
        NodeSample(node_id=n, at=now, cpu_pct=12.0, memory_used_gb=41.5, memory_total_gb=503.8)
        for n in HOSTS
    ]
    monitoring.record(samples, inventory)


def _trial_on_two_hosts(site: Site, token: str) -> tuple[int, int, dict[str, str]]:
    """A trial whose first attempt ran 2 min 5 s on host a and whose second runs on a and b,
    with user metrics and the runtime's series at 30 steps, and a checkpoint of 3.5 MB."""
    api = site.api
    r = submit(api, token)
    assert r.status_code == 201, r.text
    experiment_id, trial_id = r.json()["id"], r.json()["trials"][0]["id"]
    now = time.time()
    secret, token_hash, prefix = new_token()
    with api.services.uow() as repo:
        row = repo.add_token(token_hash, prefix, "trial", 0.0, trial_id=trial_id)
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=now - 400))
        first = repo.add_attempt(trial_id, 1, f"t{trial_id}-a1", [NODE_A] * 2, None, None, now)
        repo.update_attempt(
            first.id,
            AttemptUpdate(
                outcome="LOST", detail="node died", started_at=now - 400, ended_at=now - 275
            ),
        )
        second = repo.add_attempt(
            trial_id, 2, f"t{trial_id}-a2", [NODE_A, NODE_B], None, row.id, now - 200
        )
        repo.update_attempt(second.id, AttemptUpdate(started_at=now - 200))
        repo.add_checkpoint(trial_id, f"ck-{trial_id}", 20, 2, {"loss": 0.5}, "ck", 3_670_016, now)
    headers = api.headers(secret)
    points = [
        {
            "step": s,
            "values": {
                **{m: 1.0 / (1 + s + k) for k, m in enumerate(USER_METRICS)},
                **SYSTEM,
            },
        }
        for s in range(30)
    ]
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/metrics", json={"points": points}, headers=headers
    )
    assert r.status_code == 200, r.text
    return experiment_id, trial_id, headers


def _complete(site: Site, experiment_id: int, trial_id: int) -> None:
    with site.api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.COMPLETED, ended_at=time.time()))
        refresh_experiment_state(repo, experiment_id, time.time())


def _no_live_updates(page: Any) -> None:
    """Refuse the pages' event streams, their polling and the charts' JSON: what shows is the
    page's own data."""
    page.route("**/events*", lambda route: route.abort())
    page.route("**/curves.json*", lambda route: route.abort())
    page.route("**/chart.json*", lambda route: route.abort())


def test_the_bare_address_redirects_to_the_dashboard(browser: Any, site: Site) -> None:
    r = site.api.client.get("/", follow_redirects=False)
    assert r.status_code == 307
    assert r.headers["location"] == "/ui"
    page = browser.new_page()
    page.goto(f"{site.url}/")
    assert page.url.startswith(f"{site.url}/ui/login")
    assert page.title() == "Log in · trainhub"
    page.close()


def test_the_trial_page_puts_the_users_metrics_first_in_a_grid(browser: Any, site: Site) -> None:
    api = site.api
    nora = api.user("nora", "vision")
    _plant_hosts(site)
    _, trial_id, _ = _trial_on_two_hosts(site, nora)

    page = _login(browser, site, nora)
    page.set_viewport_size({"width": 1400, "height": 1000})
    _no_live_updates(page)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    assert page.title() == f"Trial {trial_id} · trainhub"
    # drawn from the page itself: no event stream got through
    page.wait_for_function("document.getElementById('charts').dataset.ready === '1'")
    assert page.inner_text("#points") == "30 points"
    grid = page.locator("#metric-charts canvas.chart")
    assert sorted(grid.evaluate_all("cs => cs.map(c => c.dataset.metric)")) == list(USER_METRICS)
    assert all(float(c.get_attribute("data-drawn") or 0) > 0 for c in grid.all())
    tops = grid.evaluate_all("cs => cs.map(c => Math.round(c.getBoundingClientRect().top))")
    per_row = tops.count(tops[0])
    assert per_row in (2, 3), tops
    # the runtime's series: folded under "system", below the user's metrics
    system = page.locator("#system-charts")
    assert system.is_visible()
    assert not system.evaluate("d => d.open")
    names = page.locator("#system-charts canvas.chart").evaluate_all(
        "cs => cs.map(c => c.dataset.metric)"
    )
    assert sorted(names) == sorted(SYSTEM)
    assert page.inner_text("#system-charts summary .count") == str(len(SYSTEM))
    page.screenshot(path=str(site.screenshots / "first-day-trial.png"), full_page=False)
    page.click("#system-charts summary")
    page.wait_for_function(
        "document.querySelector('#system-charts canvas.chart').getBoundingClientRect().width > 300"
    )

    # nodes by hostname, the id on hover; durations and sizes in human units
    attempts = page.inner_text("#attempts")
    assert "gpu-host-a (2 ranks)" in attempts
    assert "gpu-host-a, gpu-host-b" in attempts
    assert NODE_A not in attempts
    assert NODE_A[:12] not in attempts
    assert page.get_attribute("#attempts span.node >> nth=0", "title") == NODE_A
    assert "2 min 5 s" in attempts
    assert re.search(r"\b3 min \d+ s so far", attempts)  # the running one, begun 200 s ago
    timeline = page.inner_text("#attempt-timeline")
    assert "gpu-host-a, gpu-host-b" in timeline
    assert NODE_B not in timeline
    assert "3.5 MB" in page.inner_text("#checkpoints")
    # a running trial may be paused and killed, not resumed
    assert page.locator("#trial-actions form[action$='/pause']").is_visible()
    assert page.locator("#trial-actions form[action$='/kill']").is_visible()
    assert not page.locator("#trial-actions form[action$='/resume']").is_visible()
    page.screenshot(path=str(site.screenshots / "first-day-trial-full.png"), full_page=True)
    page.close()


def test_a_completed_trial_and_experiment_offer_no_actions(browser: Any, site: Site) -> None:
    api = site.api
    omar = api.user("omar", "vision")
    experiment_id, trial_id, _ = _trial_on_two_hosts(site, omar)
    _complete(site, experiment_id, trial_id)

    page = _login(browser, site, omar)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    assert page.inner_text("#trial-state") == "COMPLETED"
    for verb in ("pause", "resume", "kill"):
        assert page.locator(f"form[action$='/{verb}']").count() == 0
    assert page.get_by_role("button", name="Pause").count() == 0

    _no_live_updates(page)
    page.goto(f"{site.url}/ui/experiments/{experiment_id}")
    assert page.inner_text("#experiment-state") == "COMPLETED"
    assert page.get_by_role("button", name="Pause").count() == 0
    assert page.get_by_role("button", name="Kill").count() == 0
    assert page.locator("#clone-form").count() == 1  # cloning stays
    # a text title, and the learning curves drawn from the page without a stream or a fetch
    assert page.title() == f"demo · experiment {experiment_id} · trainhub"
    assert "<" not in page.title()
    page.wait_for_function("document.getElementById('curves').dataset.drawn")
    assert int(page.get_attribute("#curves", "data-shown") or 0) == 30
    page.screenshot(path=str(site.screenshots / "first-day-experiment.png"), full_page=True)
    page.close()


def test_a_running_trial_loses_its_buttons_live_when_it_completes(browser: Any, site: Site) -> None:
    api = site.api
    pia = api.user("pia", "vision")
    experiment_id, trial_id, _ = _trial_on_two_hosts(site, pia)
    page = _login(browser, site, pia)
    page.goto(f"{site.url}/ui/trials/{trial_id}")
    page.wait_for_function("document.body.dataset.live === 'sse'")
    assert page.locator("#trial-actions form[action$='/pause']").is_visible()
    _complete(site, experiment_id, trial_id)
    page.wait_for_function("document.getElementById('trial-state').textContent === 'COMPLETED'")
    page.wait_for_function("document.getElementById('trial-actions') === null")
    assert page.get_by_role("button", name="Pause").count() == 0
    page.close()


def test_the_cluster_page_names_nodes_and_says_which_memory_is_which(
    browser: Any, site: Site
) -> None:
    """node-a: the host has 48 GB (its agent), Ray lets trials reserve 32 of it (its memory
    resource): the page, `GET /nodes` (`trainhub nodes`) and `GET /cluster` (`trainhub
    cluster`) show the same two figures, each named."""
    api = site.api
    monitoring = api.services.monitoring
    assert monitoring is not None
    inventory = NodeInventory(
        node_id="node-a", hostname="cpu-host-a", cpu_model="Xeon", num_cores=8, memory_gb=48.0
    )
    monitoring.record([], {"node-a": inventory})
    _plant_hosts(site)
    nodes = api.client.get("/api/v1/nodes", headers=api.headers(api.admin_token)).json()["data"]
    cluster = api.client.get("/api/v1/cluster", headers=api.headers(api.admin_token)).json()
    by_id = {n["node_id"]: n for n in nodes}
    in_cluster = {n["node_id"]: n for n in cluster["nodes"]}
    assert by_id["node-a"]["memory_gb"] == in_cluster["node-a"]["host_memory_gb"] == 48.0
    assert by_id["node-a"]["reservable_memory_gb"] == in_cluster["node-a"]["total_memory_gb"]
    assert in_cluster["node-a"]["total_memory_gb"] == 32.0
    assert in_cluster["node-a"]["hostname"] == "cpu-host-a"

    page = _login(browser, site, api.admin_token)
    page.goto(f"{site.url}/ui/cluster")
    node = page.locator("section.node[data-node='node-a']")
    assert node.locator("h2").inner_text().startswith("cpu-host-a")
    assert "48.0 GB memory" in node.inner_text()
    assert "32.0 GB of it for trials" in node.inner_text()
    named = page.locator(f"section.node[data-node='{NODE_A}'] h2").inner_text()
    assert named.startswith("gpu-host-a")
    assert NODE_A not in named
    assert (
        "41.5 / 503.8 GB used" in page.locator(f"section.node[data-node='{NODE_A}']").inner_text()
    )
    page.screenshot(path=str(site.screenshots / "first-day-cluster.png"), full_page=True)
    page.close()


def test_a_search_page_draws_every_chart_from_the_page_itself(browser: Any, site: Site) -> None:
    """The experiment page's title is its name, not the best-so-far block, and the plot, the
    curves and the best so far are drawn with no stream and no fetch getting through."""
    api = site.api
    quinn = api.user("quinn", "vision")
    experiment_id, trial_ids = _search(site, quinn)
    for trial_id, acc in zip(trial_ids[:3], (0.6, 0.5, 0.8), strict=True):
        _acc(site, trial_id, _start(site, trial_id), acc)
        with api.services.uow() as repo:
            write_trial(
                repo, trial_id, TrialUpdate(state=TrialState.COMPLETED, ended_at=time.time())
            )

    page = _login(browser, site, quinn)
    _no_live_updates(page)
    page.goto(f"{site.url}/ui/experiments/{experiment_id}")
    assert page.title() == f"lr-search · experiment {experiment_id} · trainhub"
    page.wait_for_function("document.getElementById('best-so-far').dataset.drawn === '3'")
    page.wait_for_function("document.getElementById('parcoords').dataset.lines === '3'")
    page.wait_for_function("document.getElementById('curves').dataset.drawn")
    assert int(page.get_attribute("#curves", "data-shown") or 0) == 9  # 3 steps of 3 trials
    # still ACTIVE (a trial runs): its actions stay
    assert page.get_by_role("button", name="Pause").count() == 1
    page.screenshot(path=str(site.screenshots / "first-day-search.png"), full_page=True)
    page.close()


PAGES = {
    "/ui/experiments": "Experiments · trainhub",
    "/ui/queue": "Queue · trainhub",
    "/ui/usage": "Usage · trainhub",
    "/ui/cluster": "Cluster · trainhub",
    "/ui/admin/tenants": "Tenants · trainhub",
    "/ui/admin/users": "Users · trainhub",
    "/ui/admin/tokens": "Tokens · trainhub",
    "/ui/experiments/999999": "404 · trainhub",
}


def test_every_page_has_a_text_title(browser: Any, site: Site) -> None:
    page = _login(browser, site, site.api.admin_token)
    for path, title in PAGES.items():
        page.goto(f"{site.url}{path}")
        assert page.title() == title, path
    page.close()
