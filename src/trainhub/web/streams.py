"""The live-update streams of the pages (server-sent events, see web/live.py):

- ``/ui/trials/{id}/events?rank=R``: ``chart`` (the chart's data when points arrived or the
  state changed), ``log`` (new output of rank R of the latest attempt; its id is
  ``attempt:offset`` so a reconnect resumes there), ``gpus`` (the trial's GPUs, HTML), and with a
  ``chart`` event those of ``timing`` (where the step's time goes), ``attempts`` (their
  timeline and table) and ``alerts`` (layer health) that changed (HTML);
- ``/ui/experiments/{id}/events``: ``experiment`` (state, the trials' rows, the plot's data);
- ``/ui/queue/events``: ``queue`` (the queue's rows, HTML, and their count);
- ``/ui/cluster/events``: ``nodes`` (the nodes' part of the page, HTML);
- ``/ui/experiments/events?state=&project=&name=&page=``: ``experiments`` (that page of the
  list, filtered as the page is, HTML, and the count);
- ``/ui/usage/events``: ``usage`` (the period, the chart's data and the tables, HTML).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response

from trainhub.core.downsample import DEFAULT_BUCKETS
from trainhub.core.states import trial_actions
from trainhub.service.ports import Principal
from trainhub.web.cluster import render_nodes, render_trial_gpus
from trainhub.web.lists import ListQuery, experiments_update, list_query, usage_update
from trainhub.web.live import Event, Produce, stream
from trainhub.web.profiles import render_profiles
from trainhub.web.sessions import SESSION_COOKIE
from trainhub.web.site import Site, templates
from trainhub.web.trial_parts import render_parts
from trainhub.web.views import experiment_update

TRIAL_INTERVAL_S = 1.0  # logs follow at this pace
PAGE_INTERVAL_S = 2.0
USAGE_INTERVAL_S = 5.0  # a week of attempts summed per look; hours grow slowly
_TERMINAL = {"COMPLETED", "FAILED", "CANCELED", "PRUNED", "ERROR"}


def _resume_point(last_event_id: str | None) -> tuple[int | None, int]:
    """(attempt, offset) from a log event's id ``attempt:offset``."""
    if last_event_id:
        attempt, _, offset = last_event_id.partition(":")
        if attempt.isdigit() and offset.isdigit() and len(attempt) + len(offset) < 30:
            return int(attempt), int(offset)
    return None, 0


def trial_produce(site: Site, trial_id: int, rank: int, last_event_id: str | None) -> Produce:
    services = site.services
    attempt, offset = _resume_point(last_event_id)
    seen: dict[str, Any] = {"chart": None, "gpus_at": 0}
    tick = 0

    def produce(principal: Principal) -> list[Event]:
        nonlocal attempt, offset, tick
        tick += 1
        detail = services.experiments.get_trial(principal, trial_id)  # 404 if not visible
        trial = detail.trial
        events: list[Event] = []
        state = trial.state.value
        chart = site.charts.chart(principal, trial_id, trial.num_attempts, DEFAULT_BUCKETS)
        fingerprint = (chart["points"], state, trial.num_attempts)
        if fingerprint != seen["chart"]:
            seen["chart"] = fingerprint
            actions = list(trial_actions(trial.state))
            events.append(("chart", {**chart, "state": state, "actions": actions}, None))
            for name, html in render_parts(
                detail, site.hostnames()
            ).items():  # step timing, attempts, alerts
                if seen.get(name) != html:
                    seen[name] = html
                    events.append((name, {"html": html}, None))
        chunk = services.tracking.read_logs(principal, trial_id, attempt, rank, offset)
        if chunk.complete and not chunk.data and attempt is not None:
            newest = services.tracking.read_logs(principal, trial_id, None, rank, 0)
            if newest.attempt != attempt:  # a new attempt runs: follow it from its start
                chunk, offset = newest, 0
        attempt = chunk.attempt or None  # 0: no attempt yet
        if chunk.data:
            offset = chunk.next_offset
            text = chunk.data.decode("utf-8", errors="replace")
            events.append(
                (
                    "log",
                    {"attempt": chunk.attempt, "rank": rank, "text": text, "next": offset},
                    f"{chunk.attempt}:{offset}",
                )
            )
        events.append(("profiles", {"html": render_profiles(site, principal, trial_id)}, None))
        if tick % 3 == 1 and state not in _TERMINAL:  # the agents sample every few seconds
            events.append(("gpus", {"html": render_trial_gpus(site, principal, trial_id)}, None))
        return events

    return produce


def add_live_routes(router: APIRouter, site: Site) -> None:
    services = site.services

    @router.get("/trials/{trial_id}/events")
    async def trial_events(
        request: Request,
        trial_id: int,
        rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        last_event_id: Annotated[str | None, Header(max_length=64)] = None,
    ) -> Response:
        produce = trial_produce(site, trial_id, rank, last_event_id)
        return await stream(request, site, produce, interval_s=TRIAL_INTERVAL_S)

    @router.get("/experiments/{experiment_id}/events")
    async def experiment_events(request: Request, experiment_id: int) -> Response:
        def produce(principal: Principal) -> list[Event]:
            return [("experiment", experiment_update(services, principal, experiment_id), None)]

        return await stream(request, site, produce, interval_s=PAGE_INTERVAL_S)

    @router.get("/queue/events")
    async def queue_events(request: Request) -> Response:
        rows = templates.get_template("_queue_rows.html")

        def produce(principal: Principal) -> list[Event]:
            trials = services.experiments.queue(principal)
            return [("queue", {"html": rows.render(trials=trials), "count": len(trials)}, None)]

        return await stream(request, site, produce, interval_s=PAGE_INTERVAL_S)

    @router.get("/cluster/events")
    async def cluster_events(request: Request) -> Response:
        def produce(principal: Principal) -> list[Event]:
            session = site.sessions.get(request.cookies.get(SESSION_COOKIE))
            csrf = session.csrf if session else ""
            return [("nodes", {"html": render_nodes(site, principal, csrf)}, None)]

        return await stream(request, site, produce, interval_s=PAGE_INTERVAL_S)


def add_list_live_routes(router: APIRouter, site: Site) -> None:
    """The experiments list's and the usage page's streams (registered before the experiment
    page's route, whose ``{experiment_id}`` would take ``events``)."""
    services = site.services

    @router.get("/experiments/events")
    async def experiments_events(
        request: Request, q: Annotated[ListQuery, Depends(list_query)]
    ) -> Response:
        def produce(principal: Principal) -> list[Event]:
            return [("experiments", experiments_update(services, principal, q), None)]

        return await stream(request, site, produce, interval_s=PAGE_INTERVAL_S)

    @router.get("/usage/events")
    async def usage_events(request: Request) -> Response:
        def produce(principal: Principal) -> list[Event]:
            return [("usage", usage_update(services, principal), None)]

        return await stream(request, site, produce, interval_s=USAGE_INTERVAL_S)
