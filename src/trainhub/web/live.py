"""Live updates of the dashboard's pages by server-sent events (docs/adr/0017).

One stream per open page: every ``interval_s`` the page's ``produce`` function is called with
the session's principal (authenticated again each time, so a revoked token ends its streams)
and returns named events; an event is sent only when its data changed since it was last sent.
Streams are bounded (core/limits.py): so many per session and in all (429 beyond), a comment
line at least every ``LIVE_HEARTBEAT_S`` so proxies keep the connection, and an end after
``LIVE_STREAM_MAX_S`` (the browser's EventSource reconnects by itself, with ``Last-Event-ID``
so a log resumes where it was). The script falls back to polling where a stream fails.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trainhub.core import limits
from trainhub.core.errors import TrainhubError
from trainhub.service.ports import Principal
from trainhub.web.sessions import SESSION_COOKIE
from trainhub.web.site import LoginNeeded, Site

# (event name, data, id or None); the id goes to the browser's Last-Event-ID
Event = tuple[str, Any, str | None]
Produce = Callable[[Principal], list[Event]]


def _frame(name: str, data: str, event_id: str | None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


async def stream(
    request: Request,
    site: Site,
    produce: Produce,
    *,
    interval_s: float,
    max_s: float = limits.LIVE_STREAM_MAX_S,
    heartbeat_s: float = limits.LIVE_HEARTBEAT_S,
) -> Response:
    """A text/event-stream of what ``produce`` returns, or a JSON error: 401 without a
    session, 429 beyond the bounds, the service's 403/404 where the first call fails (so a
    page of another tenant answers 404 here too). With ``?once=1``, the first batch as JSON
    (what the script polls where a stream fails)."""
    try:
        _, principal = await run_in_threadpool(site.session, request)
    except LoginNeeded:
        return JSONResponse({"code": "unauthenticated", "message": "log in"}, 401)
    try:
        first = await run_in_threadpool(produce, principal)
    except TrainhubError as exc:
        return JSONResponse({"code": exc.code, "message": exc.message}, exc.status_code)
    if request.query_params.get("once"):
        return JSONResponse(
            {"events": [{"event": n, "data": d, "id": i} for n, d, i in first]},
            headers={"Cache-Control": "no-cache"},
        )
    sid = request.cookies.get(SESSION_COOKIE, "")
    refused = site.streams.take(sid)
    if refused is not None:
        return JSONResponse({"code": "too_many_streams", "message": refused}, 429)

    async def events() -> AsyncIterator[str]:
        sent: dict[str, str] = {}
        started = last_sent = time.monotonic()
        batch: list[Event] = first
        try:
            yield f"retry: {int(interval_s * 2000)}\n\n"
            while True:
                for name, data, event_id in batch:
                    text = json.dumps(data, separators=(",", ":"))
                    if sent.get(name) != text:
                        sent[name] = text
                        last_sent = time.monotonic()
                        yield _frame(name, text, event_id)
                now = time.monotonic()
                if now - last_sent >= heartbeat_s:
                    last_sent = now
                    yield ": heartbeat\n\n"
                if now - started >= max_s:
                    return
                await asyncio.sleep(interval_s)
                if await request.is_disconnected():
                    return
                try:
                    _, who = await run_in_threadpool(site.session, request)
                    batch = await run_in_threadpool(produce, who)
                except LoginNeeded:
                    yield _frame("logout", "{}", None)
                    return
                except TrainhubError as exc:
                    yield _frame("failed", json.dumps({"message": exc.message}), None)
                    return
        finally:
            site.streams.give_back(sid)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
