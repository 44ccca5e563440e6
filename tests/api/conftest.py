"""An API on SQLite with a known cluster (two CPU nodes), and the same API served by uvicorn."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from tests.fixtures.api import Api
from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.api.app import create_app
from trainhub.api.guard import FailedAuthLimiter
from trainhub.core.resources import Node
from trainhub.service.admin import AdminService
from trainhub.service.clock import system_clock
from trainhub.service.container import Services
from trainhub.service.experiments import ExperimentService
from trainhub.service.steering import SteeringService
from trainhub.service.tracking import TrackingService
from trainhub.service.usage import UsageService

# the largest node: 8 CPUs, no GPU
NODES = [
    Node("node-a", total_gpus=0, total_cpus=8.0, free_gpus=0, free_cpus=8.0),
    Node("node-b", total_gpus=0, total_cpus=4.0, free_gpus=0, free_cpus=4.0),
]


def build_bounded_api(root: Path, limiter: FailedAuthLimiter | None = None) -> Api:
    engine = make_engine(f"sqlite:///{root / 'trainhub.db'}")
    migrate(engine)
    uow = SqlUnitOfWork(engine)
    store = LocalArtifactStore(root / "artifacts")
    admin = AdminService(uow, system_clock)
    experiments = ExperimentService(uow, store, system_clock, cluster_nodes=lambda: NODES)
    # the search routes too, as the server wires them: the walk and the fuzzing cover them
    backend = OptunaSearch.for_database(f"sqlite:///{root / 'trainhub.db'}")
    steering = SteeringService(
        SqlSearchUnitOfWork(engine), experiments, store, backend, system_clock
    )
    services = Services(
        uow=uow,
        clock=system_clock,
        experiments=experiments,
        steering=steering,
        tracking=TrackingService(uow, store, system_clock),
        admin=admin,
        usage=UsageService(uow, system_clock),
        cluster_nodes=lambda: NODES,
    )
    issued = admin.bootstrap()
    assert issued is not None
    return Api(TestClient(create_app(services, limiter)), issued.secret, services, store)


@pytest.fixture
def bapi(tmp_path: Path) -> Iterator[Api]:
    built = build_bounded_api(tmp_path)
    with built.client:
        yield built
    built.services.uow.engine.dispose()  # type: ignore[attr-defined]


@dataclass
class Served:
    api: Api
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The bounded API behind a real uvicorn on a free port."""
    api = build_bounded_api(tmp_path)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        api.client.app, log_level="warning", lifespan="off", ws="none", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "uvicorn exited while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        time.sleep(0.01)
    try:
        yield Served(api, "127.0.0.1", port)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def sapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One bounded API for a module's tests that only read or get refused."""
    built = build_bounded_api(tmp_path_factory.mktemp("shared"))
    with built.client:
        yield built
    built.services.uow.engine.dispose()  # type: ignore[attr-defined]
