"""One control-loop tick at scale: 3,000 running trials and 2,000 queued, fair policy.

The loop runs on a real SQLite database (or, with ``--db postgresql``, a new database on the
server on 127.0.0.1:5432) and artifact store with the test harness's fake
executor (tests/service/loop_harness.py: no Ray, polls answered from memory), so the tick's
time is the control plane's own: reading the active trials and their open attempts, judging
each attempt, storing log output, and the scheduling decision. Prints one JSON line: the
median of 10 steady ticks (after the queue's pending notes are written; before each, 25
running attempts exit, so 25 trials complete and 25 queued ones start, and the attempts
launched a tick earlier run) and of 10 reads of every open attempt. ``--baseline ROOT``
measures the code of another checkout (a worktree of an older commit) in the same run first,
and adds the ratios:

    .venv/bin/python benchmarks/control_loop_tick.py
    git worktree add /tmp/before d905155
    .venv/bin/python benchmarks/control_loop_tick.py --baseline /tmp/before

Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RUNNING, QUEUED, NODES = 3000, 2000, 375  # 375 nodes x 8 CPUs: the 3,000 fill them
CHURN = 25  # attempts that exit before each measured tick
SPEC = "name: s\nentrypoint: sleep 3600\nresources: {workers: 1, cpus_per_worker: 1}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--baseline", type=Path, help="another checkout, measured first")
    parser.add_argument(
        "--db",
        choices=["sqlite", "postgresql"],
        default="sqlite",
        help="a new SQLite file, or a new database on the PostgreSQL server on 127.0.0.1:5432",
    )
    args = parser.parse_args(argv)
    baseline = None
    if args.baseline is not None:  # its own process: a process imports one trainhub
        ran = subprocess.run(
            [sys.executable, __file__, "--root", str(args.baseline), "--db", args.db],
            capture_output=True,
            text=True,
            check=True,
        )
        baseline = json.loads(ran.stdout.strip().splitlines()[-1])
        print(json.dumps(baseline), flush=True)
    # the code of --root, not the installed package (to compare commits)
    sys.path[:0] = [str(args.root), str(args.root / "src")]
    from tests.service.loop_harness import LoopHarness, cpu_nodes

    from trainhub.core.scheduling import create_policy
    from trainhub.core.states import TrialState
    from trainhub.service.control_loop import LoopConfig
    from trainhub.service.ports import AttemptPhase

    with tempfile.TemporaryDirectory() as folder, _database(args.db) as url:
        h = LoopHarness(
            Path(folder),
            create_policy("fair"),
            cpu_nodes(NODES),
            LoopConfig("http://127.0.0.1:1"),
            db_url=url,
        )
        try:
            for _ in range(RUNNING):
                h.submit(SPEC)
            h.tick()  # places all of them
            for key in list(h.executor.attempts):
                h.executor.run(key)
            for _ in range(QUEUED):
                h.submit(SPEC)
            for _ in range(3):  # marks them running; the queue's notes written
                h.clock.step(5)
                h.tick()
            ticks = []
            rng = random.Random(0)
            for _ in range(10):
                # churn, as a busy cluster has it: 25 running attempts exit (their trials
                # complete, 25 queued ones start) and the ones launched a tick ago run
                launched = [
                    k for k, a in h.executor.attempts.items() if a.phase is AttemptPhase.PLACING
                ]
                for key in launched:
                    h.executor.run(key)
                live = sorted(
                    k for k, a in h.executor.attempts.items() if a.phase is AttemptPhase.RUNNING
                )
                for key in rng.sample(live, CHURN):
                    h.executor.exit(key, [0])
                h.clock.step(5)
                t0 = time.perf_counter()
                h.tick()
                ticks.append(time.perf_counter() - t0)
            with h.uow() as repo:
                active = repo.scheduling_records([TrialState.RUNNING])
            ids = [t.id for t in active]
            reads = []
            for _ in range(10):
                t0 = time.perf_counter()
                with h.uow() as repo:
                    repo.open_attempts(ids)
                reads.append(time.perf_counter() - t0)
        finally:
            h.close()
    tick_ms = round(statistics.median(ticks) * 1e3, 1)
    open_ms = round(statistics.median(reads) * 1e3, 1)
    line: dict[str, object] = {
        "benchmark": "control_loop_tick",
        "running": len(ids),
        "queued": QUEUED,
        "exits_per_tick": CHURN,
        "tick_ms": tick_ms,
        "open_attempts_ms": open_ms,
        "root": str(args.root),
        "db": args.db,
    }
    if baseline is not None:
        line["tick_vs_baseline"] = round(tick_ms / float(baseline["tick_ms"]), 3)
        line["open_attempts_vs_baseline"] = round(open_ms / float(baseline["open_attempts_ms"]), 3)
    print(json.dumps(line), flush=True)
    return 0


@contextmanager
def _database(kind: str) -> Iterator[str | None]:
    """None (the harness's own SQLite file), or a new PostgreSQL database, dropped after."""
    if kind == "sqlite":
        yield None
        return
    from sqlalchemy import create_engine, text

    name = f"trainhub_tick_{uuid.uuid4().hex[:8]}"
    admin = create_engine(
        "postgresql+psycopg://127.0.0.1:5432/postgres", isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield f"postgresql+psycopg://127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


if __name__ == "__main__":
    sys.exit(main())
