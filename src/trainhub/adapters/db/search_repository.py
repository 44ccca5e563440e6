"""SQLAlchemy implementation of the search repository, in one transaction with the main one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from trainhub.adapters.db import changes
from trainhub.adapters.db.models import TenantRow
from trainhub.adapters.db.repository import SqlRepository
from trainhub.adapters.db.search_models import SearchRow, SpecTemplateRow, SteeredTrialRow
from trainhub.core.errors import NotFound
from trainhub.service.search_ports import (
    SearchRecord,
    SearchState,
    SearchUpdate,
    SpecTemplate,
    SteeredTrial,
    SteeredUpdate,
    StopIntent,
)


def _search(row: SearchRow) -> SearchRecord:
    return SearchRecord(
        row.experiment_id,
        SearchState(row.state),
        row.max_trials,
        row.max_concurrent_trials,
        row.rng_state,
        row.created_at,
    )


def _steered(row: SteeredTrialRow) -> SteeredTrial:
    return SteeredTrial(
        trial_id=row.trial_id,
        experiment_id=row.experiment_id,
        backend_id=row.backend_id,
        number=row.number,
        reported_step=row.reported_step,
        best_value=row.best_value,
        told=row.told,
        stop_intent=StopIntent(row.stop_intent) if row.stop_intent else None,
        stop_detail=row.stop_detail,
        warm_start_checkpoint_id=row.warm_start_checkpoint_id,
        parent_trial_id=row.parent_trial_id,
        due_step=row.due_step,
        extra=dict(row.extra or {}),
    )


class SqlSearchRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def ensure_search(
        self, experiment_id: int, max_trials: int, max_concurrent_trials: int, now: float
    ) -> SearchRecord:
        row = self.s.get(SearchRow, experiment_id)
        if row is not None:
            return _search(row)
        try:
            with self.s.begin_nested():
                row = SearchRow(
                    experiment_id=experiment_id,
                    state=SearchState.RUNNING.value,
                    max_trials=max_trials,
                    max_concurrent_trials=max_concurrent_trials,
                    rng_state=0,
                    created_at=now,
                )
                self.s.add(row)
        except IntegrityError:  # made at the same time by another transaction
            row = self.s.get_one(SearchRow, experiment_id)
        return _search(row)

    def get_search(self, experiment_id: int) -> SearchRecord | None:
        row = self.s.get(SearchRow, experiment_id)
        return _search(row) if row else None

    def searches_in_states(self, states: Sequence[SearchState]) -> list[SearchRecord]:
        rows = self.s.scalars(
            select(SearchRow)
            .where(SearchRow.state.in_([s.value for s in states]))
            .order_by(SearchRow.experiment_id)
        )
        return [_search(r) for r in rows]

    def update_search(self, experiment_id: int, update: SearchUpdate) -> SearchRecord:
        row = self.s.get(SearchRow, experiment_id)
        if row is None:
            raise NotFound(f"experiment {experiment_id} is not a search")
        for key, value in update.changes().items():
            setattr(row, key, value.value if isinstance(value, SearchState) else value)
        self.s.flush()
        return _search(row)

    def add_steered(self, record: SteeredTrial) -> SteeredTrial:
        values = dataclasses.asdict(record)
        values["stop_intent"] = record.stop_intent.value if record.stop_intent else None
        row = SteeredTrialRow(**values)
        self.s.add(row)
        self.s.flush()
        return _steered(row)

    def get_steered(self, trial_id: int) -> SteeredTrial | None:
        row = self.s.get(SteeredTrialRow, trial_id)
        return _steered(row) if row else None

    def list_steered(self, experiment_id: int) -> list[SteeredTrial]:
        rows = self.s.scalars(
            select(SteeredTrialRow)
            .where(SteeredTrialRow.experiment_id == experiment_id)
            .order_by(SteeredTrialRow.trial_id)
        )
        return [_steered(r) for r in rows]

    def update_steered(self, trial_id: int, update: SteeredUpdate) -> SteeredTrial:
        row = self.s.get(SteeredTrialRow, trial_id)
        if row is None:
            raise NotFound(f"trial {trial_id} has no search record")
        for key, value in update.changes().items():
            setattr(row, key, value.value if isinstance(value, StopIntent) else value)
        self.s.flush()
        return _steered(row)

    def save_template(self, template: SpecTemplate) -> SpecTemplate:
        tenant = self.s.scalar(select(TenantRow).where(TenantRow.name == template.tenant))
        if tenant is None:
            raise NotFound(f"tenant {template.tenant!r} does not exist")
        row = self.s.scalar(
            select(SpecTemplateRow).where(
                SpecTemplateRow.tenant_id == tenant.id, SpecTemplateRow.name == template.name
            )
        )
        if row is None:
            row = SpecTemplateRow(tenant_id=tenant.id, name=template.name)
            self.s.add(row)
        row.spec_yaml = template.spec_yaml
        row.context_key = template.context_key
        row.created_by = template.created_by
        row.created_at = template.created_at
        self.s.flush()
        return template

    def get_template(self, tenant: str, name: str) -> SpecTemplate | None:
        row = self.s.execute(
            select(SpecTemplateRow, TenantRow.name)
            .join(TenantRow, TenantRow.id == SpecTemplateRow.tenant_id)
            .where(TenantRow.name == tenant, SpecTemplateRow.name == name)
        ).first()
        return _template(row[0], row[1]) if row else None

    def list_templates(self, tenants: Sequence[str] | None) -> list[SpecTemplate]:
        query = select(SpecTemplateRow, TenantRow.name).join(
            TenantRow, TenantRow.id == SpecTemplateRow.tenant_id
        )
        if tenants is not None:
            query = query.where(TenantRow.name.in_(list(tenants)))
        rows = self.s.execute(query.order_by(TenantRow.name, SpecTemplateRow.name))
        return [_template(row, tenant) for row, tenant in rows]


def _template(row: SpecTemplateRow, tenant: str) -> SpecTemplate:
    return SpecTemplate(
        tenant, row.name, row.spec_yaml, row.context_key, row.created_by, row.created_at
    )


@dataclasses.dataclass(frozen=True)
class SqlSearchTx:
    repo: SqlRepository
    search: SqlSearchRepository


class SqlSearchUnitOfWork:
    """``with uow() as tx:`` gives both repositories on one session; commits at the end."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = changes.track(sessionmaker(engine, expire_on_commit=False))

    @contextmanager
    def __call__(self) -> Iterator[SqlSearchTx]:
        with self._sessions() as session:
            try:
                yield SqlSearchTx(SqlRepository(session), SqlSearchRepository(session))
                session.commit()
            except BaseException:
                session.rollback()
                raise
