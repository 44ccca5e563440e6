"""The sessions page (start, stop) and the authenticated proxy to each session's server.

``/ui/sessions/{id}/server/...`` is the only way to a session's server: every HTTP request and
every WebSocket handshake is authenticated (an API token as ``Authorization: Bearer``, or the
dashboard's session cookie, whose path is /ui) and authorised by
:meth:`~trainhub.service.sessions.SessionService.upstream` (the owner, the tenant's admins,
cluster admins). No credentials: 401; anyone else, a trial's token included: 404, as for any
object of another tenant. The forwarding itself is the relay's (adapters/session_proxy.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from trainhub.core.errors import FieldError, InvalidSpec, TrainhubError, Unauthenticated
from trainhub.core.session_spec import SessionKind, parse_duration
from trainhub.service.ports import Principal
from trainhub.service.sessions import SessionRequest, SessionService, Upstream, base_url
from trainhub.web.sessions import SESSION_COOKIE
from trainhub.web.site import PREFIX, Site

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
MAX_PROXIED_BODY_BYTES = 256 * 1024 * 1024  # a notebook file saved through the proxy


def _service(site: Site) -> SessionService:
    service = site.services.sessions
    if service is None:
        raise TrainhubError("this control plane runs without sessions")
    return service


def _bearer(headers: Any) -> str | None:
    scheme, _, secret = str(headers.get("authorization", "")).partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def _principal(site: Site, headers: Any, cookies: dict[str, str]) -> Principal:
    """The caller, from an API token or the dashboard's cookie; Unauthenticated otherwise."""
    token = _bearer(headers)
    if token is None:
        session = site.sessions.get(cookies.get(SESSION_COOKIE))
        if session is None:
            raise Unauthenticated(
                "no API token or dashboard login was given",
                f"log in at {PREFIX}/login, or send 'Authorization: Bearer <token>'",
            )
        token = session.secret
    return site.services.authenticate(token)


def _refusal(exc: TrainhubError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status_code)


def sessions_context(site: Site, principal: Principal) -> dict[str, Any]:
    service = _service(site)
    return {
        "sessions": service.list_sessions(principal, include_ended=True)[:50],
        "kinds": [k.value for k in SessionKind if k != SessionKind.TENSORBOARD],
    }


def add_session_routes(router: APIRouter, site: Site) -> None:
    @router.get("/sessions")
    def sessions_page(request: Request) -> Response:
        return site.page(request, "sessions.html", lambda p: sessions_context(site, p))

    @router.post("/sessions")
    async def start_session(request: Request) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> str:
            try:
                gpus = int(form.get("gpus") or 0)
            except ValueError:
                raise InvalidSpec([FieldError("gpus", "is not a whole number", "")]) from None
            timeout = form.get("idle_timeout") or ""
            try:
                idle = parse_duration(timeout, "idle_timeout") if timeout else None
            except ValueError as exc:
                raise InvalidSpec([FieldError("idle_timeout", str(exc), "")]) from None
            data = tuple(d.strip() for d in (form.get("data") or "").split(",") if d.strip())
            started = _service(site).start(
                principal,
                SessionRequest(
                    kind=SessionKind(form.get("kind") or "notebook"),
                    gpus=gpus,
                    idle_timeout_s=idle,
                    data=data,
                ),
            )
            return f"{PREFIX}/sessions#session-{started.id}"

        return await site.action(request, act, f"{PREFIX}/sessions")

    @router.post("/sessions/{session_id}/stop")
    async def stop_session(request: Request, session_id: int) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            _service(site).stop(principal, session_id)

        return await site.action(request, act, f"{PREFIX}/sessions")

    @router.get("/sessions/{session_id}/terminal")
    def terminal_page(request: Request, session_id: int) -> Response:
        """The dashboard's web terminal of a session (static/terminal.js, xterm.js): one of
        the session server's terminals, over the proxy below like any of its WebSockets."""

        def build(principal: Principal) -> dict[str, Any]:
            service = _service(site)
            service.check_access(principal, session_id)
            return {"session": service.get(principal, session_id), "base": base_url(session_id)}

        return site.page(request, "session_terminal.html", build)

    async def upstream_of(headers: Any, cookies: dict[str, str], session_id: int) -> Upstream:
        def find() -> Upstream:
            principal = _principal(site, headers, cookies)
            return _service(site).upstream(principal, session_id)

        return await run_in_threadpool(find)

    @router.api_route("/sessions/{session_id}/server/{path:path}", methods=_METHODS)
    async def proxy_http(request: Request, session_id: int, path: str) -> Response:
        try:
            upstream = await upstream_of(request.headers, request.cookies, session_id)
        except TrainhubError as exc:
            return _refusal(exc)
        declared = request.headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > MAX_PROXIED_BODY_BYTES:
            return JSONResponse({"code": "too_large", "message": "body too large"}, 413)
        body = await request.body()
        service = _service(site)
        assert service.relay is not None
        service.activity.touch(session_id, site.services.clock())
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            status, headers, chunks, close = await service.relay.http(
                upstream.endpoint,
                upstream.secret,
                request.method,
                target,
                request.headers.items(),
                body,
            )
        except OSError as exc:
            return JSONResponse(
                {"code": "session_unreachable", "message": f"the session's server: {exc}"}, 502
            )
        except Exception as exc:  # httpx's transport errors: the server went away
            return JSONResponse(
                {"code": "session_unreachable", "message": f"the session's server: {exc!r}"},
                502,
            )
        response = StreamingResponse(chunks, status_code=status, background=BackgroundTask(close))
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return response

    @router.websocket("/sessions/{session_id}/server/{path:path}")
    async def proxy_websocket(websocket: WebSocket, session_id: int, path: str) -> None:
        try:
            upstream = await upstream_of(websocket.headers, websocket.cookies, session_id)
        except TrainhubError as exc:
            await websocket.send_denial_response(_refusal(exc))
            return
        service = _service(site)
        assert service.relay is not None
        query = websocket.url.query
        target = websocket.url.path + (f"?{query}" if query else "")
        protocols = websocket.scope.get("subprotocols") or []
        try:
            remote = await service.relay.websocket(
                upstream.endpoint,
                upstream.secret,
                target,
                websocket.headers.get("host", "localhost"),
                websocket.headers.items(),
                list(protocols),
            )
        except Exception as exc:
            await websocket.send_denial_response(
                JSONResponse({"code": "session_unreachable", "message": repr(exc)}, 502)
            )
            return
        await websocket.accept(subprotocol=remote.subprotocol)
        clock = site.services.clock
        service.activity.opened(session_id, clock())
        try:
            await service.relay.pump(websocket.receive, websocket.send, remote)
        finally:
            service.activity.closed(session_id, clock())
