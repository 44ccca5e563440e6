"""The services of one control plane, built once at start-up and handed to the entry points."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainhub.core.resources import Node
from trainhub.service.admin import AdminService, authenticate_with
from trainhub.service.clock import Clock
from trainhub.service.datasets import DatasetService
from trainhub.service.debugging import DebugService
from trainhub.service.direct_checkpoints import DirectCheckpoints
from trainhub.service.environments import EnvironmentService
from trainhub.service.experiments import ExperimentService
from trainhub.service.monitoring import MonitoringService
from trainhub.service.ports import Principal
from trainhub.service.profiling import ProfilingService
from trainhub.service.registry import RegistryService
from trainhub.service.repository import UnitOfWork
from trainhub.service.sessions import SessionService
from trainhub.service.steering import SteeringService
from trainhub.service.tracking import TrackingService
from trainhub.service.usage import UsageService


@dataclass
class Services:
    uow: UnitOfWork
    clock: Clock
    experiments: ExperimentService
    tracking: TrackingService
    admin: AdminService
    usage: UsageService
    cluster_nodes: Callable[[], list[Node]]
    sandbox: str = "none"  # how rank processes are isolated: bwrap | none
    warnings: tuple[str, ...] = ()  # what an admin must know about this deployment
    steering: SteeringService | None = None  # searches, pause/resume, clone (api/routes/search)
    monitoring: MonitoringService | None = None  # nodes, health, /metrics (api/routes/monitoring)
    models: RegistryService | None = None  # the model registry (api/routes/models)
    debugging: DebugService | None = None  # sample records, debug reports (api/routes/debugging)
    profiling: ProfilingService | None = None  # trainhub profile (api/routes/profiles)
    environments: EnvironmentService | None = None  # trainhub envs (api/routes/environments)
    datasets: DatasetService | None = None  # trainhub data (api/routes/datasets)
    # presigned checkpoint transfers of ranks (api/routes/trial_storage, ADR 0033)
    direct_checkpoints: DirectCheckpoints | None = None
    sessions: SessionService | None = None  # notebooks, shells, TensorBoard (docs/sessions.md)
    # the IP addresses of the cluster's nodes: never locked out as a whole by the
    # failed-authentication limit (api/failed_auth.py); loopback always counts
    node_addresses: Callable[[], Iterable[str]] = tuple

    def authenticate(self, secret: str | None) -> Principal:
        return authenticate_with(self.uow, self.clock, secret)
