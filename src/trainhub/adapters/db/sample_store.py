"""Training dynamics of samples in the database (migration 0007): one packed row per batch."""

from __future__ import annotations

from sqlalchemy import (
    Engine,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    func,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base
from trainhub.service.debugging import StoredBatch


class SampleRecordBatchRow(Base):
    __tablename__ = "sample_record_batches"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    source: Mapped[str | None] = mapped_column(String(128), nullable=True)
    num_classes: Mapped[int] = mapped_column(Integer)
    num_records: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


class SqlSampleStore:
    """:class:`~trainhub.service.debugging.SampleStore` on SQLAlchemy; short transactions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add_batch(self, trial_id: int, batch: StoredBatch, uuid: str, now: float) -> bool:
        try:
            with Session(self.engine) as session, session.begin():
                if session.scalar(
                    select(SampleRecordBatchRow.id).where(SampleRecordBatchRow.uuid == uuid)
                ):
                    return False
                session.add(
                    SampleRecordBatchRow(
                        trial_id=trial_id,
                        attempt=batch.attempt,
                        uuid=uuid,
                        source=batch.source,
                        num_classes=batch.num_classes,
                        num_records=batch.num_records,
                        data=batch.data,
                        created_at=now,
                    )
                )
        except IntegrityError:  # the same uuid stored by a concurrent retry
            return False
        return True

    def count_records(self, trial_id: int) -> int:
        with Session(self.engine) as session:
            total = session.scalar(
                select(func.coalesce(func.sum(SampleRecordBatchRow.num_records), 0)).where(
                    SampleRecordBatchRow.trial_id == trial_id
                )
            )
            return int(total or 0)

    def batches(self, trial_id: int) -> list[StoredBatch]:
        with Session(self.engine) as session:
            rows = session.execute(
                select(
                    SampleRecordBatchRow.attempt,
                    SampleRecordBatchRow.source,
                    SampleRecordBatchRow.num_classes,
                    SampleRecordBatchRow.num_records,
                    SampleRecordBatchRow.data,
                )
                .where(SampleRecordBatchRow.trial_id == trial_id)
                .order_by(SampleRecordBatchRow.id)
            ).all()
            return [StoredBatch(*row) for row in rows]
