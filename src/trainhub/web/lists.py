"""What the experiments list and the usage page show, built once for the page and for its
live updates (web/streams.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Query

from trainhub.api.params import ExperimentSort, SortOrder
from trainhub.core import limits
from trainhub.core.errors import NotFound
from trainhub.core.states import ExperimentState
from trainhub.service.container import Services
from trainhub.service.ports import Principal
from trainhub.web.site import PAGE_SIZE, templates


@dataclass(frozen=True)
class ListQuery:
    """The experiments list's filters and page, as the page and its stream take them."""

    state: str
    page: int
    project: str
    name: str
    tenant: str = ""
    user: str = ""
    sort: str = "created"
    order: str = "desc"

    def filters(self) -> str:
        """The filters and sort as a query string (the pager's links add the page)."""
        return urlencode(
            {
                "state": self.state,
                "tenant": self.tenant,
                "project": self.project,
                "user": self.user,
                "name": self.name,
                "sort": self.sort,
                "order": self.order,
            }
        )


_Filter = Annotated[str, Query(max_length=limits.MAX_LIST_FILTER_CHARS)]


def list_query(
    state: Annotated[str | None, Query(max_length=32)] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    project: _Filter = "",
    name: _Filter = "",
    tenant: _Filter = "",
    user: _Filter = "",
    sort: ExperimentSort = "created",
    order: SortOrder = "desc",
) -> ListQuery:
    return ListQuery(state or "", page, project, name, tenant, user, sort, order)


def experiments_context(services: Services, principal: Principal, q: ListQuery) -> dict[str, Any]:
    chosen = None
    if q.state:
        try:
            chosen = ExperimentState(q.state)
        except ValueError as exc:
            raise NotFound(f"no experiment state {q.state!r}") from exc
    rows, count = services.experiments.list_experiments(
        principal,
        chosen,
        PAGE_SIZE,
        (q.page - 1) * PAGE_SIZE,
        project=q.project or None,
        name_contains=q.name or None,
        tenant=q.tenant or None,
        owner=q.user or None,
        sort=q.sort,
        order=q.order,
    )
    return {
        "experiments": rows,
        "count": count,
        "page": q.page,
        "pages": max(1, -(-count // PAGE_SIZE)),
        "state": q.state,
        "project": q.project,
        "name": q.name,
        "tenant": q.tenant,
        "user_filter": q.user,  # not "user": that is the logged-in user in base.html
        "sort": q.sort,
        "order": q.order,
        "sorts": limits.EXPERIMENT_SORTS,
        "query": q.filters(),
        "live": f"/ui/experiments/events?{q.filters()}&page={q.page}",
        "states": [s.value for s in ExperimentState],
    }


def experiments_update(services: Services, principal: Principal, q: ListQuery) -> dict[str, Any]:
    """The live part of the experiments list: its rows, the pager and the count."""
    context = experiments_context(services, principal, q)
    html = templates.get_template("_experiments_list.html").render(**context)
    return {"html": html, "count": context["count"]}


def usage_context(services: Services, principal: Principal) -> dict[str, Any]:
    report = services.usage.report(principal, None, None)
    days = sorted({r.day for r in report.rows})
    hours: dict[str, dict[str, float]] = {}
    for r in report.rows:
        per_day = hours.setdefault(r.tenant, {})
        per_day[r.day] = per_day.get(r.day, 0.0) + r.slot_hours
    # 4 digits, as the tables show them: a running trial's hours grow every second, and a
    # live stream sends an event only when what it shows changed
    series = {
        tenant: {"x": list(range(len(days))), "y": [float(f"{h.get(d, 0.0):.4g}") for d in days]}
        for tenant, h in sorted(hours.items())
    }
    return {"report": report, "chart": {"days": days, "series": series}}


def usage_update(services: Services, principal: Principal) -> dict[str, Any]:
    """The live part of the usage page: the period, the chart's data and both tables."""
    context = usage_context(services, principal)
    html = templates.get_template("_usage_tables.html").render(**context)
    period = templates.get_template("_usage_period.html").render(**context)
    return {"html": html, "chart": context["chart"], "period": period}
