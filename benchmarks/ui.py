"""The dashboard's speed: a chart of a million points, and the experiments page at scale.

Prints JSON lines:
- {"benchmark": "chart_1m", "server_ms", "draw_ms", ...}: one trial holding 1,000,000 points of
  one metric. server_ms: median wall time of GET /ui/trials/ID/chart.json through uvicorn on
  localhost, once the trial's series is in the chart cache (targets < 100 ms); cold_ms: the
  first request, which reads all rows from the database; baseline_full_read_ms: reading every
  point through the tracking service (what a chart without cache and downsampling costs), and
  the ratio. draw_ms: median time from navigation start to the chart drawn in Chromium
  (performance.now() when the canvas is painted; target < 500 ms).
- {"benchmark": "experiments_page", "db": "sqlite"|"postgresql", "p95_ms", "api_p95_ms", ...}:
  with N experiments of 10 trials each in the database, p95 of GET /ui/experiments (random
  pages, a third filtered by state, a third sorted by the best metric, a sixth filtered by
  submitter) and of GET /api/v1/experiments the same way.

Rows are filled with SQL inserts (benchmark set-up only), cloned from one experiment submitted
through the API.

    HOME=$(mktemp -d) .venv/bin/python benchmarks/ui.py [--experiments 10000] [--db sqlite]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import insert, select  # noqa: E402
from tests.api.test_auth import submit  # noqa: E402
from tests.fixtures.api import Api, build_api  # noqa: E402  (needs sys.path)
from tests.fixtures.databases import PG_ADMIN_URL  # noqa: E402
from tests.web.conftest import CHROMIUM, serve  # noqa: E402

from trainhub.adapters.db.models import ExperimentRow, TrialRow  # noqa: E402


def login(url: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=120)
    form = client.get("/ui/login").text
    found = re.search(r'name="csrf" value="([^"]+)"', form)
    assert found is not None
    r = client.post("/ui/login", data={"token": token, "csrf": found.group(1)})
    assert r.status_code in (200, 303), r.text
    assert "trainhub_session" in client.cookies
    return client


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1]


def timed(client: httpx.Client, path: str, **kw: Any) -> float:
    started = time.perf_counter()
    r = client.get(path, **kw)
    elapsed = (time.perf_counter() - started) * 1000
    assert r.status_code == 200, (path, r.status_code, r.text[:200])
    return elapsed


def chart_1m(api: Api, url: str, token: str, points: int) -> dict[str, Any]:
    r = submit(api, token)
    trial_id = r.json()["trials"][0]["id"]
    rng = random.Random(0)
    started = time.perf_counter()
    # through the repository's ingestion (what POST /metrics does, without HTTP), in the
    # runtime's batch size: it keeps the packed chunks a chart's first read takes
    batch = 1000
    for first in range(0, points, batch):
        rows = [
            (s, {"loss": 2.0 / (1 + s / 1000) + rng.gauss(0, 0.05)})
            for s in range(first, min(points, first + batch))
        ]
        with api.services.uow() as repo:
            repo.upsert_metrics(trial_id, 1, rows, 0.0)
    fill_s = time.perf_counter() - started
    principal = api.services.authenticate(token)
    started = time.perf_counter()
    total, after = 0, None
    while True:
        page = api.services.tracking.list_metrics(principal, trial_id, after, 100_000)
        if not page:
            break
        total, after = total + len(page), page[-1].step
    full_read_ms = (time.perf_counter() - started) * 1000
    assert total == points

    client = login(url, token)
    path = f"/ui/trials/{trial_id}/chart.json"
    cold_ms = timed(client, path)
    warm = [timed(client, path) for _ in range(7)]
    body = client.get(path).json()
    kept = len(body["metrics"]["loss"]["x"])

    draw = []
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        host = url.split("//", 1)[1].split(":", maxsplit=1)[0]
        cookie = client.cookies["trainhub_session"]
        context.add_cookies(
            [{"name": "trainhub_session", "value": cookie, "domain": host, "path": "/ui"}]
        )
        page = context.new_page()
        canvas = "document.querySelector('canvas[data-metric=loss]')"
        for _ in range(5):
            page.goto(f"{url}/ui/trials/{trial_id}")
            page.wait_for_function(f"{canvas}?.dataset.drawn")
            drawn = page.evaluate(f"{canvas}.dataset.drawn")
            draw.append(float(drawn))
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "trainhub-chart-1m.png"))
        browser.close()
    server_ms = statistics.median(warm)
    return {
        "benchmark": "chart_1m",
        "points": points,
        "server_ms": round(server_ms, 1),
        "draw_ms": round(statistics.median(draw), 1),
        "cold_ms": round(cold_ms, 1),
        "baseline_full_read_ms": round(full_read_ms, 1),
        "server_vs_full_read": round(server_ms / full_read_ms, 4),
        "points_sent": kept,
        "fill_s": round(fill_s, 1),
    }


def _best(value: float, missing: bool) -> dict[str, float | None]:
    """The stored best of the searcher's metric (mode max: the rank is -value); some none."""
    if missing:
        return {"best_value": None, "best_rank": None}
    return {"best_value": value, "best_rank": -value}


def experiments_page(api: Api, url: str, token: str, db: str, count: int) -> dict[str, Any]:
    r = submit(api, token)
    assert r.status_code == 201, r.text
    engine = api.services.uow.engine  # type: ignore[attr-defined]
    started = time.perf_counter()
    with engine.begin() as conn:
        experiment = conn.execute(
            select(ExperimentRow).where(ExperimentRow.id == r.json()["id"])
        ).one()
        trial = conn.execute(select(TrialRow).where(TrialRow.experiment_id == r.json()["id"])).one()
        e_cols = {c: getattr(experiment, c) for c in experiment._fields if c != "id"}
        t_cols = {c: getattr(trial, c) for c in trial._fields if c not in ("id", "experiment_id")}
        states = ["ACTIVE", "COMPLETED", "CANCELED", "FAILED"]
        batch = 1000
        for first in range(1, count, batch):
            n = min(batch, count - first)
            ids = conn.execute(
                insert(ExperimentRow).returning(ExperimentRow.id),
                [
                    {
                        **e_cols,
                        "name": f"exp-{first + i}",
                        "state": states[(first + i) % 4],
                        **_best((first + i) * 7919 % 1000 / 1000, (first + i) % 10 == 0),
                    }
                    for i in range(n)
                ],
            ).scalars()
            conn.execute(
                insert(TrialRow),
                [
                    {**t_cols, "experiment_id": eid, "hparams": {"lr": 0.01 * k}}
                    for eid in ids
                    for k in range(10)
                ],
            )
    fill_s = time.perf_counter() - started
    client = login(url, token)
    rng = random.Random(1)
    pages, apis, best = [], [], []
    for i in range(60):
        page = rng.randint(1, count // 50)
        state = "COMPLETED" if i % 3 == 0 else ""
        # a third sorted by the best metric, a sixth filtered by submitter and sorted by name
        extra = {"sort": "best"} if i % 3 == 1 else {}
        if i % 6 == 2:
            extra = {"user": "admin", "sort": "name", "order": "asc"}
        query = {"page": page, **({"state": state} if state else {}), **extra}
        pages.append(timed(client, "/ui/experiments", params=query))
        if i % 3 == 1:
            best.append(pages[-1])
        api_query = {
            "offset": (page - 1) * 50,
            "limit": 50,
            **({"state": state} if state else {}),
            **extra,
        }
        apis.append(
            timed(
                client,
                "/api/v1/experiments",
                params=api_query,
                headers={"Authorization": f"Bearer {token}"},
            )
        )
    return {
        "benchmark": "experiments_page",
        "db": db,
        "experiments": count,
        "trials": count * 10,
        "p95_ms": round(p95(pages), 1),
        "api_p95_ms": round(p95(apis), 1),
        "best_sort_p95_ms": round(p95(best), 1),
        "p50_ms": round(statistics.median(pages), 1),
        "fill_s": round(fill_s, 1),
    }


def run(db: str, root: Path, args: argparse.Namespace) -> None:
    url_of_db = None
    if db == "postgresql":
        import psycopg

        name = f"trainhub_bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url_of_db = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    try:
        api = build_api(url_of_db or f"sqlite:///{root / 'trainhub.db'}", root)
        server, thread, sock, port = serve(api)
        url = f"http://127.0.0.1:{port}"
        try:
            token = api.user("alice", "vision")
            if db == "sqlite" and not args.skip_chart:
                print(json.dumps(chart_1m(api, url, token, args.points)), flush=True)
            print(json.dumps(experiments_page(api, url, token, db, args.experiments)), flush=True)
        finally:
            server.should_exit = True
            thread.join(10)
            sock.close()
            api.services.uow.engine.dispose()  # type: ignore[attr-defined]
    finally:
        if url_of_db is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--skip-chart", action="store_true")
    args = parser.parse_args()
    for db in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        with tempfile.TemporaryDirectory() as root:
            run(db, Path(root), args)


if __name__ == "__main__":
    main()
