"""What the dashboard's routes share: the templates, the sessions, the chart cache, and how a
page, a JSON answer and a form action check the session (and its CSRF token) before calling a
service with the session's principal."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from trainhub.api.guard import FailedAuthLimiter
from trainhub.core.errors import TrainhubError, Unauthenticated
from trainhub.service.container import Services
from trainhub.service.ports import Principal
from trainhub.web.charts import ChartCache
from trainhub.web.sessions import SESSION_COOKIE, Session, Sessions
from trainhub.web.slots import StreamSlots

PREFIX = "/ui"
PAGE_SIZE = 50
HERE = Path(__file__).parent
_T = TypeVar("_T")

templates = Jinja2Templates(directory=str(HERE / "templates"))


_ROUTER_HINTS = {
    404: f"there is no such page: start from {PREFIX}/experiments",
    405: "this address does not take that method: open it as a page",
    422: "a part of the address is malformed (ids are whole numbers): check the link",
}


def error_page(request: Request, status: int, message: str) -> Response | None:
    """The page for a browser's request of a dashboard URL that the router itself refused
    (no such route, a malformed path or query); None for anything else, which keeps the API's
    JSON (the pages' scripts fetch JSON from /ui too)."""
    path = request.url.path
    if path != PREFIX and not path.startswith(PREFIX + "/"):
        return None
    if "text/html" not in request.headers.get("accept", ""):
        return None
    error = {"status_code": status, "message": message, "hint": _ROUTER_HINTS.get(status)}
    return templates.TemplateResponse(
        request, "error.html", {"user": None, "csrf": "", "error": error}, status_code=status
    )


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else ""


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _bytes(value: float) -> str:
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def _duration(seconds: float | None) -> str:
    """``45 s``, ``12 min 5 s``, ``3 h 20 min``, ``2 d 4 h``: two units at most."""
    if seconds is None:
        return ""
    s = max(0, round(float(seconds)))
    if s < 60:
        return f"{float(seconds):.1f} s" if 0 < seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 // 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h" if s % 86400 // 3600 else f"{s // 86400} d"


templates.env.filters["when"] = _when
templates.env.filters["duration"] = _duration
templates.env.filters["bytes"] = _bytes
templates.env.filters["num"] = _num


class LoginNeeded(Exception):
    pass


class Site:
    """What the routes share: the services, the sessions, the chart cache."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.sessions = Sessions()
        self.charts = ChartCache(services)
        self.limiter = FailedAuthLimiter()  # the API's bound on guessing tokens, here too
        self.streams = StreamSlots()  # live updates (web/live.py)

    def hostnames(self) -> dict[str, str]:
        """Node id: hostname, as the nodes' agents report them; where no agent runs (monitoring
        off), as the cluster engine names them."""
        monitoring = self.services.monitoring
        names = monitoring.hostnames() if monitoring is not None else {}
        if not names:
            names = {n.node_id: n.hostname for n in self.services.cluster_nodes() if n.hostname}
        return names

    def session(self, request: Request) -> tuple[Session, Principal]:
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is None:
            raise LoginNeeded
        try:
            principal = self.services.authenticate(session.secret)
        except Unauthenticated as exc:  # revoked or expired since the login
            self.sessions.close(request.cookies.get(SESSION_COOKIE))
            raise LoginNeeded from exc
        return session, principal

    def page(
        self,
        request: Request,
        template: str,
        build: Callable[[Principal], dict[str, Any]],
    ) -> Response:
        try:
            session, principal = self.session(request)
        except LoginNeeded:
            return RedirectResponse(
                f"{PREFIX}/login?{urlencode({'next': request.url.path})}", status_code=303
            )
        try:
            context = build(principal)
        except TrainhubError as exc:
            return templates.TemplateResponse(
                request,
                "error.html",
                {"user": principal, "csrf": session.csrf, "error": exc},
                status_code=exc.status_code,
            )
        return templates.TemplateResponse(
            request, template, {"user": principal, "csrf": session.csrf, **context}
        )

    def data(self, request: Request, build: Callable[[Principal], _T]) -> Response:
        try:
            _, principal = self.session(request)
        except LoginNeeded:
            return JSONResponse({"code": "unauthenticated", "message": "log in"}, 401)
        try:
            return JSONResponse(build(principal))
        except TrainhubError as exc:
            return JSONResponse({"code": exc.code, "message": exc.message}, exc.status_code)

    def guarded(self, request: Request, answer: Callable[[], Response]) -> Response:
        """``answer()``, or the service's error as JSON (downloads)."""
        try:
            return answer()
        except TrainhubError as exc:
            return JSONResponse({"code": exc.code, "message": exc.message}, exc.status_code)

    async def action(
        self,
        request: Request,
        act: Callable[[Principal, dict[str, str]], Response | str | None],
        back: str,
    ) -> Response:
        """A form POST: checks the session's CSRF token, runs ``act`` with the principal and the
        form's text fields; redirects to ``back`` (or to the path ``act`` returns), or answers
        the response ``act`` made (a page showing what was just created)."""
        try:
            session, principal = self.session(request)
        except LoginNeeded:
            return RedirectResponse(f"{PREFIX}/login", status_code=303)
        form = await request.form()
        sent = form.get("csrf")
        if not isinstance(sent, str) or not secrets.compare_digest(sent, session.csrf):
            return HTMLResponse("the form's CSRF token is wrong: reload the page", 403)
        fields = {k: v for k, v in form.items() if isinstance(v, str) and k != "csrf"}
        try:
            done = await run_in_threadpool(act, principal, fields)
        except TrainhubError as exc:
            return self.error(request, session, principal, exc)
        if isinstance(done, Response):
            return done
        return RedirectResponse(done or back, status_code=303)

    def error(
        self, request: Request, session: Session, principal: Principal, exc: TrainhubError
    ) -> Response:
        return templates.TemplateResponse(
            request,
            "error.html",
            {"user": principal, "csrf": session.csrf, "error": exc},
            status_code=exc.status_code,
        )

    def render(
        self, request: Request, template: str, principal: Principal, context: dict[str, Any]
    ) -> Response:
        """A page for an action's answer (the session is the request's, already checked)."""
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        csrf = session.csrf if session else ""
        return templates.TemplateResponse(
            request, template, {"user": principal, "csrf": csrf, **context}
        )
