"""The cluster page (nodes, GPUs and who holds them, cordon/drain for admins) and the admin
pages (tenants, users, tokens), in a real Chromium; non-admins are refused as by the API."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.web.conftest import Site
from tests.web.test_dashboard import _login, _running_trial
from trainhub.service.clock import system_clock
from trainhub.service.monitoring import GpuSample, NodeInventory, NodeSample

pytestmark = pytest.mark.browser


def _plant_gpus(site: Site, trial_id: int) -> None:
    """node-a reports two GPUs, the first held by ``trial_id`` and hot."""
    monitoring = site.api.services.monitoring
    assert monitoring is not None
    gpus = (
        GpuSample(
            index=0,
            uuid="GPU-aaaa-0000",
            utilization_pct=93.0,
            memory_used_gb=30.5,
            memory_total_gb=80.0,
            temperature_c=86.0,
            power_w=310.0,
            sm_clock_mhz=1410.0,
            trial_ids=(trial_id,),
        ),
        GpuSample(
            index=1,
            uuid="GPU-aaaa-0001",
            utilization_pct=0.0,
            memory_used_gb=0.4,
            memory_total_gb=80.0,
            temperature_c=41.0,
            power_w=62.0,
        ),
    )
    inventory = NodeInventory(
        node_id="node-a",
        hostname="gpu-host-a",
        cpu_model="AMD EPYC 7763",
        num_cores=64,
        memory_gb=512.0,
        gpus=tuple(
            {"model": "NVIDIA A100-SXM4-80GB", "memory_gb": "80", "driver": "550.54", "uuid": u}
            for u in (g.uuid for g in gpus)
        ),
        nics=({"name": "eth0", "speed_mbps": "100000", "address": "10.0.0.7"},),
    )
    sample = NodeSample(
        node_id="node-a",
        at=system_clock(),
        cpu_pct=41.0,
        memory_used_gb=120.0,
        memory_total_gb=512.0,
        gpus=gpus,
        trials={trial_id: (180.0, 24.0)},
    )
    monitoring.record([sample], {"node-a": inventory})


def test_the_cluster_page_shows_gpus_and_admins_cordon_a_node(browser: Any, site: Site) -> None:
    api = site.api
    erin = api.user("erin", "vision")
    _, trial_id, _ = _running_trial(site, erin)
    _plant_gpus(site, trial_id)

    page = _login(browser, site, api.admin_token)  # the admin
    page.goto(f"{site.url}/ui/cluster")
    node = page.locator("section.node[data-node='node-a']")
    assert "AMD EPYC 7763" in node.inner_text()
    assert "NVIDIA A100-SXM4-80GB" in node.inner_text()
    assert "100000 Mb/s" in node.inner_text()
    gpu0 = node.locator("tr[data-gpu='GPU-aaaa-0000']")
    assert "86 °C" in gpu0.inner_text()
    assert "310 W" in gpu0.inner_text()
    assert gpu0.locator(f"a[href='/ui/trials/{trial_id}']").count() == 1
    assert "idle" in node.locator("tr[data-gpu='GPU-aaaa-0001']").inner_text()
    page.screenshot(path=str(site.screenshots / "cluster.png"), full_page=True)

    node.locator("input[name=reason]").first.fill("fan replacement")
    node.locator("button.node-cordon").click()
    page.wait_for_url(f"{site.url}/ui/cluster")
    node = page.locator("section.node[data-node='node-a']")
    assert "cordoned" in node.inner_text()
    assert "fan replacement" in node.inner_text()
    monitoring = api.services.monitoring
    assert monitoring is not None
    assert monitoring.node_overlay()["node-a"][0] is False  # the scheduler sees it
    node.locator("button.node-uncordon").click()
    page.wait_for_url(f"{site.url}/ui/cluster")
    assert monitoring.node_overlay()["node-a"][0] is True
    page.close()

    # a member of another tenant: no buttons, and the trial on the GPU is not shown
    frank = api.user("frank", "audio")
    page = _login(browser, site, frank)
    page.goto(f"{site.url}/ui/cluster")
    node = page.locator("section.node[data-node='node-a']")
    assert "86 °C" in node.inner_text()
    assert node.locator(f"a[href='/ui/trials/{trial_id}']").count() == 0
    assert node.locator("button.node-cordon").count() == 0
    csrf = page.locator("form.logout input[name=csrf]").get_attribute("value")
    refused = page.request.post(f"{site.url}/ui/nodes/node-a/drain", form={"csrf": csrf or ""})
    assert refused.status == 403
    page.close()


def test_admin_pages_create_a_tenant_a_user_and_a_token(browser: Any, site: Site) -> None:
    api = site.api
    page = _login(browser, site, api.admin_token)
    page.goto(f"{site.url}/ui/admin/tenants")
    form = page.locator("#new-tenant")
    form.locator("input[name=name]").fill("robotics")
    form.locator("input[name=guaranteed_slots]").fill("8")
    form.locator("input[name=limit_slots]").fill("16")
    form.locator("button").click()
    page.wait_for_url(f"{site.url}/ui/admin/tenants")
    row = page.locator("tr[data-tenant='robotics']")
    assert re.search(r"robotics\s+8\s+16", row.inner_text())
    row.locator("input[name=guaranteed_slots]").fill("4")
    row.locator("button").click()
    page.wait_for_url(f"{site.url}/ui/admin/tenants")
    assert re.search(r"robotics\s+4\s+16", page.locator("tr[data-tenant='robotics']").inner_text())
    # the API's bounds, with the field named
    form = page.locator("#new-tenant")
    form.locator("input[name=name]").fill("toolarge")
    form.locator("input[name=guaranteed_slots]").fill("99999999")
    form.locator("button").click()
    assert "guaranteed_slots" in page.inner_text("[role=alert]")
    page.goto(f"{site.url}/ui/admin/tenants")
    page.screenshot(path=str(site.screenshots / "admin-tenants.png"), full_page=True)

    page.goto(f"{site.url}/ui/admin/users")
    page.locator("#new-user input[name=username]").fill("grace")
    page.locator("#new-user button").click()
    page.wait_for_url(f"{site.url}/ui/admin/users")
    row = page.locator("tr[data-user='grace']")
    row.locator("select[name=tenant]").select_option("robotics")
    row.locator("select[name=role]").select_option("viewer")
    row.locator("button", has_text="Set").click()
    page.wait_for_url(f"{site.url}/ui/admin/users")
    assert "robotics: viewer" in page.locator("tr[data-user='grace']").inner_text()
    page.screenshot(path=str(site.screenshots / "admin-users.png"), full_page=True)

    page.goto(f"{site.url}/ui/admin/tokens?user=grace")
    page.locator("#new-token input[name=name]").fill("laptop")
    page.locator("#new-token button").click()
    secret = page.inner_text("#issued-token")
    assert secret.startswith("th_")
    assert "laptop" in page.inner_text("#tokens")
    page.screenshot(path=str(site.screenshots / "admin-tokens.png"), full_page=True)
    assert api.client.get("/api/v1/me", headers=api.headers(secret)).status_code == 200
    page.once("dialog", lambda dialog: dialog.accept())  # "Revoke it?"
    page.locator("#tokens button", has_text="Revoke").first.click()
    page.wait_for_url(re.compile(r".*/ui/admin/tokens\?user=grace$"))
    assert "revoked" in page.inner_text("#tokens")
    assert api.client.get("/api/v1/me", headers=api.headers(secret)).status_code == 401
    page.close()


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_non_admins_cannot_reach_admin_pages(browser: Any, site: Site, role: str) -> None:
    api = site.api
    user = api.user(f"plain-{role}", "vision", role=role)
    page = _login(browser, site, user)
    assert page.locator("nav a[href='/ui/admin/users']").count() == 0
    for path in ("/ui/admin/tenants", "/ui/admin/users", "/ui/admin/tokens"):
        response = page.goto(f"{site.url}{path}")
        assert response is not None
        assert response.status == 403, path
    csrf = page.locator("form.logout input[name=csrf]").get_attribute("value")
    for path, form in (
        ("/ui/admin/tenants", {"name": "stolen"}),
        ("/ui/admin/users", {"username": "intruder", "is_admin": "on"}),
        ("/ui/admin/tokens", {"username": "admin"}),
    ):
        refused = page.request.post(f"{site.url}{path}", form={"csrf": csrf or "", **form})
        assert refused.status == 403, path
    if role == "viewer":
        page.screenshot(path=str(site.screenshots / "admin-refused.png"), full_page=True)
    page.close()
    with api.services.uow() as repo:
        assert repo.get_tenant("stolen") is None
        assert repo.get_user_by_name("intruder") is None
