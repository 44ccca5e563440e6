"""The experiments page sorts by the best value of the searcher's metric and filters by
submitter with its form controls; its live stream keeps both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.test_auth import submit
from tests.api.test_experiment_list import _report, _spec
from tests.api.trials import start_attempt
from tests.web.conftest import Site
from tests.web.test_dashboard import _login

pytestmark = pytest.mark.browser


def _names(page: Any) -> list[str]:
    return [str(n) for n in page.eval_on_selector_all("#experiments tbody tr", _NAMES)]


_NAMES = "rows => rows.map(r => r.cells[1]?.innerText).filter(Boolean)"


def test_sort_by_best_and_filter_by_user_on_the_page(browser: Any, site: Site) -> None:
    api = site.api
    yan, zoe = api.user("yan", "sortlab"), api.user("zoe", "sortlab")
    trials = {}
    for token, name, values in (
        (yan, "y-mid", [0.5]),
        (zoe, "z-top", [0.9]),
        (yan, "y-low", [0.1]),
        (yan, "y-none", []),
    ):
        trials[name] = submit(api, token, spec=_spec(name)).json()["trials"][0]["id"]
        if values:
            _report(api, trials[name], values)
    page = _login(browser, site, yan)
    page.goto(f"{site.url}/ui/experiments?tenant=sortlab")
    assert _names(page) == ["y-none", "y-low", "z-top", "y-mid"]  # newest first
    assert page.is_visible("form.logout")  # the user filter does not hide who is logged in
    with page.expect_navigation():
        page.select_option("select[name=sort]", "best")
    assert _names(page) == ["z-top", "y-mid", "y-low", "y-none"]
    assert page.inner_text("#experiments tbody tr:first-child td.best") == "0.9"
    page.fill("input[name=user]", "yan")
    with page.expect_navigation():
        page.click(".filters button[type=submit]")
    assert _names(page) == ["y-mid", "y-low", "y-none"]
    assert page.inner_text("#experiments-count") == "3"
    assert page.input_value("input[name=user]") == "yan"
    assert page.inner_text("form.logout span") == "yan"  # the filter is not who is logged in
    # the live stream keeps the filters and the sort: a better value moves y-low up
    page.wait_for_function("document.body.dataset.live === 'sse'")
    stream = page.get_attribute("#experiments-list", "data-live") or ""
    assert all(part in stream for part in ("sort=best", "user=yan", "tenant=sortlab")), stream
    page.evaluate("window.notReloaded = true")
    h = start_attempt(api, trials["y-low"], 2)
    body = {"attempt": 2, "points": [{"step": 5, "values": {"val_accuracy": 0.7}}]}
    r = api.client.post(f"/api/v1/trials/{trials['y-low']}/metrics", json=body, headers=h)
    assert r.status_code == 200, r.text
    page.wait_for_function(
        "document.querySelector('#experiments tbody tr td:nth-child(2)')?.innerText === 'y-low'",
        timeout=10_000,
    )
    assert _names(page) == ["y-low", "y-mid", "y-none"]
    assert page.evaluate("window.notReloaded") is True
    page.screenshot(path=str(site.screenshots / "experiments-sorted.png"), full_page=True)
    page.close()
