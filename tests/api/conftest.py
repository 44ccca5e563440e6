"""An API on SQLite with a known cluster (two CPU nodes), and the same API served by uvicorn."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.fixtures.api import Api, serve
from tests.fixtures.databases import migrate_once
from trainhub.adapters.db import SqlUnitOfWork, make_engine
from trainhub.adapters.db.dataset_store import SqlDatasetStore
from trainhub.adapters.db.environment_store import SqlEnvironmentStore
from trainhub.adapters.db.profile_store import SqlProfileStore
from trainhub.adapters.db.registry_store import SqlModelStore
from trainhub.adapters.db.sample_store import SqlSampleStore
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.db.session_store import SqlSessionLimitStore
from trainhub.adapters.envs.uv import UvEnvironments
from trainhub.adapters.monitor.node_store import SqlNodeControlStore
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.adapters.sample_gallery import DatasetGallery
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.api.app import create_app
from trainhub.api.guard import FailedAuthLimiter
from trainhub.core.metric_budget import PointCaps
from trainhub.core.resources import Node
from trainhub.service.admin import AdminService
from trainhub.service.clock import system_clock
from trainhub.service.container import Services
from trainhub.service.datasets import DatasetService
from trainhub.service.debugging import DebugService
from trainhub.service.environments import EnvironmentService
from trainhub.service.experiments import ExperimentService
from trainhub.service.monitoring import MonitoringService, NodeInventory, NodeSample
from trainhub.service.profiling import ProfilingService
from trainhub.service.registry import RegistryService
from trainhub.service.sessions import SessionService
from trainhub.service.steering import SteeringService
from trainhub.service.tracking import TrackingService
from trainhub.service.usage import UsageService

# the largest node: 8 CPUs, 32 GB, no GPU
NODES = [
    Node(
        "node-a",
        total_gpus=0,
        total_cpus=8.0,
        free_gpus=0,
        free_cpus=8.0,
        total_memory_gb=32.0,
        free_memory_gb=32.0,
    ),
    Node(
        "node-b",
        total_gpus=0,
        total_cpus=4.0,
        free_gpus=0,
        free_cpus=4.0,
        total_memory_gb=16.0,
        free_memory_gb=16.0,
    ),
]


class AgentsOf:
    """The node-agent port answered for ``nodes``: one sample each, CPU only."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    def collect(self) -> list[NodeSample]:
        return [
            NodeSample(
                node_id=n.node_id,
                at=system_clock(),
                cpu_pct=5.0,
                memory_used_gb=1.0,
                memory_total_gb=16.0,
            )
            for n in self.nodes
        ]

    def inventory(self) -> list[NodeInventory]:
        return []


def build_bounded_api(
    root: Path, limiter: FailedAuthLimiter | None = None, point_caps: PointCaps | None = None
) -> Api:
    engine = make_engine(f"sqlite:///{root / 'trainhub.db'}")
    migrate_once(engine)
    uow = SqlUnitOfWork(engine)
    store = LocalArtifactStore(root / "artifacts")
    admin = AdminService(uow, system_clock)
    experiments = ExperimentService(uow, store, system_clock, cluster_nodes=lambda: NODES)
    # the search routes too, as the server wires them: the walk and the fuzzing cover them
    backend = OptunaSearch.for_database(f"sqlite:///{root / 'trainhub.db'}")
    steering = SteeringService(
        SqlSearchUnitOfWork(engine), experiments, store, backend, system_clock
    )
    # and node monitoring, fed by agents that report the two nodes (no Ray here)
    monitoring = MonitoringService(AgentsOf(NODES), SqlNodeControlStore(engine), system_clock)
    monitoring.refresh([n.node_id for n in NODES])
    # and the model registry, wired into submit as the server does
    registry = RegistryService(uow, SqlModelStore(engine), store, system_clock)
    experiments.resolve_model = registry.pin_sources
    # and tenant datasets, wired into submit as the server does
    datasets = DatasetService(
        uow,
        SqlDatasetStore(engine),
        store,
        system_clock,
        other_bytes=registry.models.bytes_of_tenant,
    )
    experiments.resolve_data = datasets.pin_data
    # and the environment cache's routes (nothing is built here: no spec asks for packages)
    environments = EnvironmentService(
        uow, SqlEnvironmentStore(engine), UvEnvironments(root / "envs"), system_clock
    )
    experiments.check_environment = environments.check_request
    tracking = TrackingService(uow, store, system_clock, point_caps)
    tracking.other_bytes = lambda tenant: (
        registry.models.bytes_of_tenant(tenant) + datasets.datasets.bytes_of_tenant(tenant)
    )
    services = Services(
        uow=uow,
        clock=system_clock,
        experiments=experiments,
        steering=steering,
        monitoring=monitoring,
        models=registry,
        # and the debugging routes (sample records, reports, image grids)
        debugging=DebugService(uow, SqlSampleStore(engine), system_clock, DatasetGallery()),
        profiling=ProfilingService(uow, SqlProfileStore(engine), store, system_clock),
        tracking=tracking,
        admin=admin,
        usage=UsageService(uow, system_clock),
        cluster_nodes=lambda: NODES,
        datasets=datasets,
        environments=environments,
        # and the sessions' routes (no executor: a session queues and is never reached here)
        sessions=SessionService(
            uow, SqlSessionLimitStore(engine), experiments, system_clock, b"test-key"
        ),
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
    try:
        with serve(api.client.app) as port:
            yield Served(api, "127.0.0.1", port)
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def sapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One bounded API for a module's tests that only read or get refused."""
    built = build_bounded_api(tmp_path_factory.mktemp("shared"))
    with built.client:
        yield built
    built.services.uow.engine.dispose()  # type: ignore[attr-defined]
