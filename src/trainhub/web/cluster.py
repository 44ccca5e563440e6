"""The cluster page: nodes, their hardware, health history and GPUs (live utilisation, memory,
temperature, power, the trials on each), and the admins' cordon / drain / uncordon buttons.

It calls the node routes of the API as plain functions, so the page shows exactly what
``GET /api/v1/nodes`` shows the same principal (trial ids only of the caller's tenants) and a
button does exactly what ``POST /api/v1/nodes/{node}/{action}`` does (admins only)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from trainhub.api.routes.monitoring import (
    NodeControlBody,
    control_node,
    list_nodes,
    node_health,
    trial_gpus,
)
from trainhub.service.ports import Principal
from trainhub.web.site import PREFIX, Site, templates

_HISTORY = 10  # health changes shown per node


def cluster_context(site: Site, principal: Principal) -> dict[str, Any]:
    services = site.services
    nodes = list_nodes(services, principal).data
    history = {n.node_id: node_health(services, principal, n.node_id, _HISTORY) for n in nodes}
    return {
        "nodes": nodes,
        "history": history,
        "gpus": sum(len(n.gpus) for n in nodes),
        "now": services.clock(),
    }


def render_nodes(site: Site, principal: Principal, csrf: str) -> str:
    """The nodes' part of the page (what a live update replaces)."""
    template = templates.get_template("_nodes.html")
    return template.render(user=principal, csrf=csrf, **cluster_context(site, principal))


def trial_gpus_context(site: Site, principal: Principal, trial_id: int) -> dict[str, Any]:
    """The GPUs a trial's processes use (the caller already checked it may see the trial)."""
    if site.services.monitoring is None:
        return {"usage": [], "usage_note": "Node monitoring is off on this control plane."}
    usage = trial_gpus(site.services, principal, trial_id).data
    return {"usage": usage, "usage_note": "No node agent has seen its processes (yet)."}


def render_trial_gpus(site: Site, principal: Principal, trial_id: int) -> str:
    template = templates.get_template("_trial_gpus.html")
    return template.render(**trial_gpus_context(site, principal, trial_id))


def add_cluster_routes(router: APIRouter, site: Site) -> None:
    @router.get("/cluster", response_class=HTMLResponse)
    def cluster_page(request: Request) -> Response:
        return site.page(request, "cluster.html", lambda p: cluster_context(site, p))

    @router.post("/nodes/{node}/{action}")
    async def node_action(
        request: Request, node: str, action: Literal["cordon", "uncordon", "drain"]
    ) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            reason = form.get("reason", "")[:500]
            control_node(site.services, principal, node, action, NodeControlBody(reason=reason))

        return await site.action(request, act, f"{PREFIX}/cluster")
