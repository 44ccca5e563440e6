"""Metric ingestion through the HTTP API, measured as users run it (issue 9: >= 50,000 points/s
from 20 concurrent reporters).

The server is the real app in its own process (``api_server.py``: uvicorn, every service, the
request guard; SQLite in a fresh home, or ``--db postgresql://...``). Each reporter is a trial's
runtime in its own process: attempt 1 running, its own trial-scoped token, and the runtime's
own client (``runtime.transport.ControlPlaneClient.post_metrics``) posting ``batches`` batches
of ``points_per_batch`` points. The reporters start together once all of them are ready; the
rate is the points stored (acknowledged) over the time from that start to the last reporter's end.
After the run the rows are counted: ``rows_stored`` must equal ``points_sent``, and a refused
batch is counted (``refused_batches``) and printed. ``server_cpu_s`` is the CPU the server's
processes used during the run (``points_per_server_cpu_s``: what one core of the server
ingests, whatever the machine's load).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/hpo.py --only ingestion [--db postgresql://...]
    HOME=$(mktemp -d) .venv/bin/python benchmarks/ingestion.py [--db URL] [--reporters 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))

from api_server import ApiServer, start_attempt  # noqa: E402  (needs sys.path)


def report(url: str, token: str, trial_id: int, batches: int, points_per_batch: int) -> None:
    """A reporter process: says READY, waits for GO on stdin, posts, prints its result."""
    from trainhub.runtime.transport import ControlPlaneClient, ControlPlaneError, TransientError

    client = ControlPlaneClient(url, token, trial_id, timeout_s=120.0)
    print("READY", flush=True)
    sys.stdin.readline()
    began, cpu_began = time.time(), time.process_time()
    stored, refused = 0, []
    for batch in range(batches):
        first = batch * points_per_batch
        points = [
            {"step": step, "values": {"loss": 1.0 / (step + 1)}, "time": time.time()}
            for step in range(first, first + points_per_batch)
        ]
        try:
            client.post_metrics({"attempt": 1, "points": points})  # type: ignore[typeddict-item]
            stored += points_per_batch
        except (ControlPlaneError, TransientError) as exc:
            refused.append(str(exc)[:200])
    ended, cpu = time.time(), time.process_time() - cpu_began
    client.close()
    print(
        json.dumps(
            {"began": began, "ended": ended, "cpu_s": cpu, "stored": stored, "refused": refused}
        )
    )


def _count_rows(db_url: str, trial_ids: list[int]) -> int:
    from sqlalchemy import func, select

    from trainhub.adapters.db import make_engine
    from trainhub.adapters.db.models import MetricRow

    engine = make_engine(db_url)
    try:
        with engine.connect() as connection:
            query = select(func.count()).where(MetricRow.trial_id.in_(trial_ids))
            return int(connection.execute(query).scalar_one())
    finally:
        engine.dispose()


class PostgresDatabase:
    """A fresh database on the PostgreSQL server of ``admin_url``, dropped at the end."""

    def __init__(self, admin_url: str) -> None:
        from sqlalchemy.engine import make_url

        self.admin_url = admin_url
        self.name = f"trainhub_ingest_{os.getpid()}"
        self.url = make_url(admin_url).set(database=self.name).render_as_string(False)

    def _admin(self, sql: str) -> None:
        import psycopg

        plain = self.admin_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(plain, autocommit=True) as connection:
            connection.execute(sql)  # type: ignore[arg-type]

    def __enter__(self) -> PostgresDatabase:
        self._admin(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *_exc: object) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def ingestion(
    reporters: int,
    batches: int,
    points_per_batch: int,
    root: Path,
    db_url: str | None = None,
) -> dict[str, Any]:
    """Points per second stored through the API, the batches refused, the rows stored."""
    import httpx

    root.mkdir(parents=True, exist_ok=True)
    with ApiServer(root, db_url=db_url) as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        trial_ids = []
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
            for index in range(reporters):
                spec = f"name: ingest-{index}\nentrypoint: python -m train\n"
                response = client.post("/api/v1/experiments", data={"spec": spec})
                response.raise_for_status()
                trial_ids.append(response.json()["trials"][0]["id"])
        # each reporter is a trial's runtime: attempt 1 running, its own trial-scoped token
        tokens = [start_attempt(server.db_url, t) for t in trial_ids]
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}"}
        procs = [
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "--report", server.url, token, str(trial)),
                    *(str(batches), str(points_per_batch)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for trial, token in zip(trial_ids, tokens, strict=True)
        ]
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("a reporter did not start")
        cpu_before = server.cpu_s()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            results.append(json.loads(out.strip().splitlines()[-1]))
        server_cpu = server.cpu_s() - cpu_before
        with open("/proc/loadavg") as handle:
            load = float(handle.read().split()[0])
        rows = _count_rows(server.db_url, trial_ids)
    stored = sum(r["stored"] for r in results)
    refused = [reason for r in results for reason in r["refused"]]
    for reason in sorted(set(refused)):
        print(f"refused batch: {reason}", file=sys.stderr)
    elapsed = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return {
        "points_per_s": round(stored / elapsed),
        "refused_batches": len(refused),
        "rows_stored": rows,
        "points_sent": reporters * batches * points_per_batch,
        "server_cpu_s": round(server_cpu, 2),
        "points_per_server_cpu_s": round(stored / server_cpu),
        "reporters_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
        "load_average": load,
        "reporter_processes": reporters,
    }


def run(reporters: int, db: str | None, root: Path) -> dict[str, Any]:
    """The benchmark's JSON line (``db``: a PostgreSQL URL whose server gets a fresh database;
    None: SQLite)."""
    batches, points_per_batch = 10, 1000
    if db:
        with PostgresDatabase(db) as database:
            measured = ingestion(reporters, batches, points_per_batch, root, database.url)
    else:
        measured = ingestion(reporters, batches, points_per_batch, root)
    return {
        "benchmark": "ingestion",
        **measured,
        "reporters": reporters,
        "points_per_batch": points_per_batch,
        "database": "postgresql" if db else "sqlite",
        "target": ">= 50000",
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--report":
        url, token, trial, batches, points = sys.argv[2:7]
        report(url, token, int(trial), int(batches), int(points))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--reporters", type=int, default=20)
    parser.add_argument("--db", default=None, help="postgresql://USER@HOST/DB (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainhub-ingest-") as tmp:
        print(json.dumps(run(args.reporters, args.db, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
