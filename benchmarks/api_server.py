"""The control plane's API in its own process, for benchmarks that measure its memory.

The process serves the real app (SQLite in a fresh home, the local artifact store, the request
guard, every service) on a free port with uvicorn, without Ray and without the control loop:
what the benchmarks send is answered by the API alone, and the scheduler would only ever see
what the API let through. The cluster the submit check sees is one node of 8 CPUs and no GPU
(``--cpus``), standing in for what Ray would report.

    python benchmarks/api_server.py HOME PORT [--cpus 8] [--db URL]   # prints READY <token>

``--db`` serves another database (a PostgreSQL URL) instead of SQLite in HOME.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ApiServer:
    """Starts ``api_server.py`` in a subprocess; ``rss_mb()`` reads its resident memory."""

    def __init__(
        self,
        home: Path,
        cpus: float = 8.0,
        db_url: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.extra_args = extra_args  # more options of main(): --storage, --rank-storage
        self.home = home
        self.cpus = cpus
        self.db_url = db_url or f"sqlite:///{home / 'trainhub.db'}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = ""
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ApiServer:
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
        self.proc = subprocess.Popen(
            [
                *(sys.executable, __file__, str(self.home), str(self.port)),
                *("--cpus", str(self.cpus), "--db", self.db_url),
                *self.extra_args,
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.home / "server.log", "w"),
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"server did not start: {(self.home / 'server.log').read_text()}")
        self.token = line.split()[1]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not answer")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    def cpu_s(self) -> float:
        """CPU seconds (user and system) the server process has used so far."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)


def start_attempt(db_url: str, trial_id: int) -> str:
    """Give a queued trial a running first attempt and its trial token, written straight to
    the server's database as the control loop would; returns the token."""
    from trainhub.adapters.db import SqlUnitOfWork, make_engine
    from trainhub.core.states import TrialState
    from trainhub.service.auth import new_token
    from trainhub.service.records import TrialUpdate
    from trainhub.service.trial_writes import write_trial

    engine = make_engine(db_url)
    secret, token_hash, prefix = new_token()
    with SqlUnitOfWork(engine)() as repo:
        token = repo.add_token(token_hash, prefix, "trial", time.time(), trial_id=trial_id)
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=time.time()))
        repo.add_attempt(trial_id, 1, f"t{trial_id}-a1", ["node-0"], None, token.id, time.time())
    engine.dispose()
    return secret


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("home", type=Path)
    parser.add_argument("port", type=int)
    parser.add_argument("--cpus", type=float, default=8.0)
    parser.add_argument("--db", default=None, help="database URL; default: SQLite in HOME")
    parser.add_argument("--storage", default=None, help="s3://BUCKET/PREFIX; default: a folder")
    parser.add_argument("--s3-endpoint", default=None)
    parser.add_argument("--rank-storage", default="control-plane", help="control-plane|direct")
    args = parser.parse_args()

    import uvicorn

    from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate
    from trainhub.adapters.storage import LocalArtifactStore, open_artifact_store
    from trainhub.api.app import create_app
    from trainhub.core.metric_budget import PointCaps
    from trainhub.core.resources import Node
    from trainhub.server import settle_heap
    from trainhub.service.admin import AdminService
    from trainhub.service.clock import system_clock
    from trainhub.service.container import Services
    from trainhub.service.direct_checkpoints import DirectCheckpoints
    from trainhub.service.experiments import ExperimentService
    from trainhub.service.tracking import TrackingService
    from trainhub.service.usage import UsageService

    nodes = [Node("node-0", 0, args.cpus, 0, args.cpus)]
    engine = make_engine(args.db or f"sqlite:///{args.home / 'trainhub.db'}")
    migrate(engine)
    uow = SqlUnitOfWork(engine)
    store = (
        open_artifact_store(args.storage, s3_endpoint=args.s3_endpoint)
        if args.storage
        else LocalArtifactStore(args.home / "artifacts")
    )
    admin = AdminService(uow, system_clock)
    # the server's capacity is measured here, not the per-trial policy: no minute cap
    # (20 reporters of 10,000 points each in a burst; docs/security.md has the default)
    tracking = TrackingService(uow, store, system_clock, PointCaps(per_minute=10**12))
    services = Services(
        uow=uow,
        clock=system_clock,
        experiments=ExperimentService(uow, store, system_clock, cluster_nodes=lambda: nodes),
        tracking=tracking,
        admin=admin,
        usage=UsageService(uow, system_clock),
        cluster_nodes=lambda: nodes,
        direct_checkpoints=DirectCheckpoints(tracking, store, args.rank_storage),
    )
    issued = admin.bootstrap()
    assert issued is not None
    app = create_app(services)
    settle_heap()  # as `trainhub server` does
    print(f"READY {issued.secret}", flush=True)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
