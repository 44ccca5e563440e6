"""The records of trial environments in the database (migration 0014)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import (
    JSON,
    BigInteger,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    delete,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base, ExperimentRow, TenantRow, TrialRow
from trainhub.core.environments import EnvironmentState
from trainhub.core.states import TrialState
from trainhub.service.environments import EnvironmentRecord

# a trial in one of these needs its environment: it is never evicted or removed under it
_NEEDING = [TrialState.QUEUED.value] + [s.value for s in TrialState if s.is_active]


class EnvironmentRow(Base):
    __tablename__ = "environments"
    request_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    state: Mapped[str] = mapped_column(String(16))
    requirements: Mapped[list[str]] = mapped_column(JSON)
    packages: Mapped[list[str]] = mapped_column(JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    built_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    num_builds: Mapped[int] = mapped_column(Integer)
    num_uses: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[list[str]] = mapped_column(JSON)
    build_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str] = mapped_column(Text)
    build_log: Mapped[str] = mapped_column(Text)


class ExperimentEnvironmentRow(Base):
    __tablename__ = "experiment_environments"
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), primary_key=True)
    request_key: Mapped[str] = mapped_column(String(64), index=True)


def _record(row: EnvironmentRow) -> EnvironmentRecord:
    return EnvironmentRecord(
        request_key=row.request_key,
        key=row.key,
        state=EnvironmentState(row.state),
        requirements=list(row.requirements or ()),
        packages=list(row.packages or ()),
        size_bytes=row.size_bytes,
        created_at=row.created_at,
        built_at=row.built_at,
        last_used_at=row.last_used_at,
        num_builds=row.num_builds,
        num_uses=row.num_uses,
        nodes=list(row.nodes or ()),
        build_s=row.build_s,
        error=row.error,
        build_log=row.build_log,
    )


class SqlEnvironmentStore:
    """:class:`~trainhub.service.environments.EnvironmentStore` on SQLAlchemy; each call is
    one short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, request_key: str) -> EnvironmentRecord | None:
        with Session(self.engine) as session:
            row = session.get(EnvironmentRow, request_key)
            return _record(row) if row is not None else None

    def begin(self, request_key: str, requirements: Sequence[str], now: float) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(EnvironmentRow, request_key)
            if row is None:
                session.add(
                    EnvironmentRow(
                        request_key=request_key,
                        key=None,
                        state=EnvironmentState.BUILDING.value,
                        requirements=list(requirements),
                        packages=[],
                        size_bytes=0,
                        created_at=now,
                        num_builds=0,
                        num_uses=0,
                        nodes=[],
                        error="",
                        build_log="",
                    )
                )
                return
            row.state = EnvironmentState.BUILDING.value
            row.error = ""

    def finish(
        self,
        request_key: str,
        key: str,
        packages: Sequence[str],
        size_bytes: int,
        build_log: str,
        build_s: float,
        built: bool,
        now: float,
    ) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(EnvironmentRow, request_key)
            if row is None:
                return
            row.key = key
            row.state = EnvironmentState.READY.value
            row.packages = list(packages)
            row.size_bytes = size_bytes
            row.build_log = build_log
            row.build_s = build_s
            row.built_at = now
            if built:  # in SQL: nodes that installed it at once each count (no lost update)
                row.num_builds = EnvironmentRow.num_builds + 1

    def fail(self, request_key: str, error: str, build_log: str, now: float) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(EnvironmentRow, request_key)
            if row is None:
                return
            row.state = EnvironmentState.FAILED.value
            row.error = error
            row.build_log = build_log
            row.built_at = now

    def use(self, request_key: str, nodes: Collection[str], now: float) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(EnvironmentRow, request_key)
            if row is None:
                return
            row.num_uses = EnvironmentRow.num_uses + 1
            row.last_used_at = now
            row.nodes = sorted(set(row.nodes or ()) | set(nodes))

    def link(self, experiment_id: int, request_key: str) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(ExperimentEnvironmentRow, experiment_id)
            if row is None:
                session.add(
                    ExperimentEnvironmentRow(experiment_id=experiment_id, request_key=request_key)
                )
            else:
                row.request_key = request_key

    def of_experiment(self, experiment_id: int) -> EnvironmentRecord | None:
        with Session(self.engine) as session:
            row = session.scalars(
                select(EnvironmentRow)
                .join(
                    ExperimentEnvironmentRow,
                    ExperimentEnvironmentRow.request_key == EnvironmentRow.request_key,
                )
                .where(ExperimentEnvironmentRow.experiment_id == experiment_id)
            ).first()
            return _record(row) if row is not None else None

    def list(self, tenants: Collection[str] | None) -> list[EnvironmentRecord]:
        with Session(self.engine) as session:
            query = select(EnvironmentRow).order_by(EnvironmentRow.created_at)
            if tenants is not None:
                visible = (
                    select(ExperimentEnvironmentRow.request_key)
                    .join(ExperimentRow, ExperimentRow.id == ExperimentEnvironmentRow.experiment_id)
                    .join(TenantRow, TenantRow.id == ExperimentRow.tenant_id)
                    .where(TenantRow.name.in_(list(tenants)))
                )
                query = query.where(EnvironmentRow.request_key.in_(visible))
            return [_record(row) for row in session.scalars(query)]

    def delete(self, request_keys: Collection[str]) -> None:
        if not request_keys:
            return
        with Session(self.engine) as session, session.begin():
            session.execute(
                delete(EnvironmentRow).where(EnvironmentRow.request_key.in_(list(request_keys)))
            )

    def in_use(self) -> set[str]:
        with Session(self.engine) as session:
            query = (
                select(ExperimentEnvironmentRow.request_key)
                .join(TrialRow, TrialRow.experiment_id == ExperimentEnvironmentRow.experiment_id)
                .where(TrialRow.state.in_(_NEEDING))
                .distinct()
            )
            return set(session.scalars(query))
