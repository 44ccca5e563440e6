"""The dashboard's pages (HTML) and the JSON their script polls for live updates."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from trainhub.core.errors import Conflict, InvalidRequest, TrainhubError, Unauthenticated
from trainhub.core.limits import INT64_MAX
from trainhub.core.spec_changes import parse_changes
from trainhub.core.states import trial_actions
from trainhub.core.step_timing import RUNTIME_PREFIXES
from trainhub.service.container import Services
from trainhub.service.metric_warnings import trial_metric_warning
from trainhub.service.ports import Principal
from trainhub.service.steering import SteeringService
from trainhub.service.usage import usage_csv as usage_csv_text
from trainhub.web.admin import add_admin_routes
from trainhub.web.cluster import add_cluster_routes, trial_gpus_context
from trainhub.web.lists import ListQuery, experiments_context, list_query, usage_context
from trainhub.web.profiles import add_profile_routes, profiles_context
from trainhub.web.session_pages import add_session_routes
from trainhub.web.sessions import LOGIN_CSRF_COOKIE, SESSION_COOKIE
from trainhub.web.site import HERE, PREFIX, LoginNeeded, Site, templates
from trainhub.web.streams import add_list_live_routes, add_live_routes
from trainhub.web.trial_parts import parts_context
from trainhub.web.views import experiment_context, learning_curves


def _cookie_flags(request: Request) -> dict[str, Any]:
    return {
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
        "path": PREFIX,
    }


def _safe_next(target: str | None) -> str:
    # only paths of the dashboard itself: no open redirect
    if target and target.startswith(PREFIX + "/") and not target.startswith("//"):
        return target
    return f"{PREFIX}/experiments"


def _steering_of(services: Services) -> SteeringService:
    if services.steering is None:
        raise Conflict(
            "this control plane runs without search and steering", "start it with trainhub server"
        )
    return services.steering


def build_router(services: Services) -> APIRouter:
    web = Site(services)
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    @router.get("", response_class=HTMLResponse)
    @router.get("/", response_class=HTMLResponse)
    def home() -> Response:
        return RedirectResponse(f"{PREFIX}/experiments", status_code=303)

    # ------------------------------------------------------------------ login
    @router.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str | None = None) -> Response:
        csrf = secrets.token_urlsafe(32)
        response = templates.TemplateResponse(
            request, "login.html", {"user": None, "csrf": csrf, "next": _safe_next(next)}
        )
        response.set_cookie(LOGIN_CSRF_COOKIE, csrf, max_age=3600, **_cookie_flags(request))
        return response

    @router.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        form = await request.form()
        token, csrf, target = form.get("token"), form.get("csrf"), form.get("next")
        expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        error = None
        if not isinstance(csrf, str) or not expected or not secrets.compare_digest(csrf, expected):
            error = "the login form expired: try again"
        elif not isinstance(token, str) or not token.strip():
            error = "paste an API token (trainhub tokens create, or the admin token)"
        address = request.client.host if request.client else "unknown"
        status = 401
        if error is None:
            assert isinstance(token, str)
            try:  # the token first: a valid one is never refused (api/failed_auth.py)
                principal = await run_in_threadpool(services.authenticate, token.strip())
            except Unauthenticated as exc:
                keys = web.limiter.keys(address, token.strip(), exc.subject)
                limited = web.limiter.refusal(keys)
                web.limiter.record(keys)
                error = exc.message
                if limited is not None:
                    error = f"too many failed logins: try again in {limited[1]:.0f} s"
                    status = 429
            except TrainhubError as exc:
                error = exc.message
            else:
                if principal.user_id is None and not principal.is_admin:
                    error = "this is a trial's token: log in with a user's token"
        if error is not None:
            fresh = secrets.token_urlsafe(32)
            refused = templates.TemplateResponse(
                request,
                "login.html",
                {
                    "user": None,
                    "csrf": fresh,
                    "next": _safe_next(str(target or "")),
                    "error": error,
                },
                status_code=status,
            )
            refused.set_cookie(LOGIN_CSRF_COOKIE, fresh, max_age=3600, **_cookie_flags(request))
            return refused
        assert isinstance(token, str)
        sid, _ = web.sessions.open(token.strip())
        response = RedirectResponse(_safe_next(str(target or "")), status_code=303)
        response.set_cookie(
            SESSION_COOKIE, sid, max_age=int(web.sessions.ttl_s), **_cookie_flags(request)
        )
        response.delete_cookie(LOGIN_CSRF_COOKIE, path=PREFIX)
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        session = web.sessions.get(request.cookies.get(SESSION_COOKIE))
        form = await request.form()
        sent = form.get("csrf")
        if (
            session is not None
            and isinstance(sent, str)
            and secrets.compare_digest(sent, session.csrf)
        ):
            web.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return response

    # ------------------------------------------------------------ experiments
    @router.get("/experiments", response_class=HTMLResponse)
    def experiments_page(
        request: Request, q: Annotated[ListQuery, Depends(list_query)]
    ) -> Response:
        return web.page(request, "experiments.html", lambda p: experiments_context(services, p, q))

    # before /experiments/{experiment_id}, which would take "events" for an id
    add_list_live_routes(router, web)

    @router.get("/experiments/{experiment_id}", response_class=HTMLResponse)
    def experiment_page(request: Request, experiment_id: int) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            context = experiment_context(services, principal, experiment_id)
            metric = context["metric"] or ""
            curves = learning_curves(web.charts, principal, context["trials"], metric)
            return {**context, "curves": {"metric": metric, "series": curves}}

        return web.page(request, "experiment.html", build)

    @router.post("/experiments/{experiment_id}/clone")
    async def clone_experiment(request: Request, experiment_id: int) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> str:
            changes = parse_changes([ln for ln in form.get("set", "").splitlines() if ln.strip()])
            raw = form.get("from_trial", "").strip()
            from_trial = int(raw) if raw.isdigit() and len(raw) < 19 else None
            if raw and from_trial is None:
                raise InvalidRequest(f"from_trial: {raw[:40]!r} is not a trial id")
            steering = _steering_of(services)
            detail = steering.clone_experiment(principal, experiment_id, changes, from_trial)
            return f"{PREFIX}/experiments/{detail.experiment.id}"

        return await web.action(request, act, f"{PREFIX}/experiments/{experiment_id}")

    @router.get("/experiments/{experiment_id}/curves.json")
    def experiment_curves(request: Request, experiment_id: int, metric: str = "") -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            detail = services.experiments.get(principal, experiment_id)
            curves = learning_curves(web.charts, principal, detail.trials, metric)
            return {"metric": metric, "series": curves}

        return web.data(request, build)

    def _steer(kind: str, verb: str) -> Callable[[Principal, int], None]:
        """``steering.<verb>_<kind>`` (e.g. ``pause_trial``), refused where search is off."""

        def act(principal: Principal, object_id: int) -> None:
            getattr(_steering_of(services), f"{verb}_{kind}")(principal, object_id)

        return act

    def _steer_route(kind: str, act: Callable[[Principal, int], None]) -> Callable[..., Any]:
        async def steer(request: Request, object_id: int) -> Response:
            return await web.action(
                request, lambda p, _: act(p, object_id), f"{PREFIX}/{kind}s/{object_id}"
            )

        return steer

    for kind in ("experiment", "trial"):
        for verb in ("pause", "resume", "kill"):
            router.add_api_route(
                f"/{kind}s/{{object_id}}/{verb}",
                _steer_route(kind, _steer(kind, verb)),
                methods=["POST"],
            )

    # ----------------------------------------------------------------- trials
    @router.get("/trials/{trial_id}", response_class=HTMLResponse)
    def trial_page(request: Request, trial_id: int) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            detail = services.experiments.get_trial(principal, trial_id)
            latest = detail.attempts[-1] if detail.attempts else None
            chart = web.charts.chart(principal, trial_id, detail.trial.num_attempts)
            return {
                **parts_context(detail, web.hostnames()),
                # drawn on first paint; the live stream then sends the full detail
                "chart": {**chart, "state": detail.trial.state.value},
                "system_prefixes": list(RUNTIME_PREFIXES),
                "actions": trial_actions(detail.trial.state),
                "experiment": detail.experiment,
                "checkpoints": detail.checkpoints,
                "limits": detail.limits,
                "events": detail.events[-50:],
                "ranks": list(range(len(latest.placement))) if latest else [],
                "steerable": services.steering is not None,
                "metric_warning": trial_metric_warning(detail.experiment.spec, detail.trial),
                **trial_gpus_context(web, principal, trial_id),
                **profiles_context(web, principal, trial_id),
            }

        return web.page(request, "trial.html", build)

    @router.get("/trials/{trial_id}/chart.json")
    def trial_chart(
        request: Request,
        trial_id: int,
        buckets: Annotated[int, Query(ge=10, le=10_000)] = 2000,
        x0: Annotated[float | None, Query(ge=-INT64_MAX, le=INT64_MAX)] = None,
        x1: Annotated[float | None, Query(ge=-INT64_MAX, le=INT64_MAX)] = None,
    ) -> Response:
        x_range = (x0, x1) if x0 is not None and x1 is not None and x0 < x1 else None

        def build(principal: Principal) -> dict[str, Any]:
            trial = services.experiments.get_trial(principal, trial_id).trial
            chart = web.charts.chart(principal, trial_id, trial.num_attempts, buckets, x_range)
            chart["state"] = trial.state.value
            return chart

        return web.data(request, build)

    @router.get("/trials/{trial_id}/logs.json")
    def trial_logs(
        request: Request,
        trial_id: int,
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        offset: Annotated[int, Query(ge=0)] = 0,
        attempt: Annotated[int | None, Query(ge=1)] = None,
    ) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            chunk = services.tracking.read_logs(principal, trial_id, attempt, rank, offset)
            return {
                "attempt": chunk.attempt,
                "text": chunk.data.decode("utf-8", errors="replace"),
                "next_offset": chunk.next_offset,
                "complete": chunk.complete,
            }

        return web.data(request, build)

    # ---------------------------------------------------------- queue, usage
    @router.get("/queue", response_class=HTMLResponse)
    def queue_page(request: Request) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            return {
                "trials": services.experiments.queue(principal),
                "note": services.experiments.guarantee_note(principal),
            }

        return web.page(request, "queue.html", build)

    @router.get("/usage", response_class=HTMLResponse)
    def usage_page(request: Request) -> Response:
        return web.page(request, "usage.html", lambda p: usage_context(services, p))

    @router.get("/usage.csv")
    def usage_csv(request: Request) -> Response:
        try:
            _, principal = web.session(request)
        except LoginNeeded:
            return RedirectResponse(f"{PREFIX}/login", status_code=303)
        report = services.usage.report(principal, None, None)
        return Response(
            usage_csv_text(report.rows),
            media_type="text/csv",
            headers={"Content-Disposition": 'attachment; filename="usage.csv"'},
        )

    add_cluster_routes(router, web)
    add_admin_routes(router, web)
    add_live_routes(router, web)
    add_profile_routes(router, web)
    add_session_routes(router, web)
    return router


def mount_ui(app: FastAPI, services: Services) -> None:
    """Serve the dashboard under /ui (pages) and /ui/static (our script and style)."""
    app.include_router(build_router(services))

    @app.get("/", include_in_schema=False)
    def root() -> Response:
        """The server's bare address is the dashboard (the API lives under /api/v1)."""
        return RedirectResponse(PREFIX, status_code=307)

    app.mount(f"{PREFIX}/static", StaticFiles(directory=str(HERE / "static")), name="ui-static")
