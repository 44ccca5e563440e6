"""The trial page's profiler: the Profile button, the per-rank tables, trace downloads."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trainhub.api.routes.profiles import ProfileId, ProfileIn, Rank, profiling
from trainhub.service.ports import Principal
from trainhub.web.forms import parse_form
from trainhub.web.site import PREFIX, LoginNeeded, Site, templates

SHOWN = 5  # latest profiles on the page


def profiles_context(site: Site, principal: Principal, trial_id: int) -> dict[str, Any]:
    service = site.services.profiling
    if service is None:
        return {"profiles": [], "profiling": False}
    return {"profiles": service.list_profiles(principal, trial_id, SHOWN), "profiling": True}


def render_profiles(site: Site, principal: Principal, trial_id: int) -> str:
    return templates.get_template("_profiles.html").render(
        **profiles_context(site, principal, trial_id)
    )


def add_profile_routes(router: APIRouter, site: Site) -> None:
    @router.post("/trials/{trial_id}/profile")
    async def request_profile(request: Request, trial_id: int) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            body = parse_form(ProfileIn, form)
            profiling(site.services).request(principal, trial_id, body.steps)

        return await site.action(request, act, f"{PREFIX}/trials/{trial_id}#profiles")

    @router.get("/trials/{trial_id}/profiles/{profile_id}/ranks/{rank}/trace")
    def download_trace(
        request: Request, trial_id: int, profile_id: ProfileId, rank: Rank
    ) -> Response:
        try:
            _, principal = site.session(request)
        except LoginNeeded:
            return Response("log in", status_code=401)
        return site.guarded(
            request,
            lambda: Response(
                profiling(site.services).trace(principal, trial_id, profile_id, rank),
                media_type="application/gzip",
                headers={
                    "Content-Disposition": (
                        f'attachment; filename="trial{trial_id}-profile{profile_id}'
                        f'-rank{rank}.trace.json.gz"'
                    )
                },
            ),
        )
