"""Tables. Times are UTC unix seconds (float) so SQLite and PostgreSQL agree exactly."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class TenantRow(Base):
    __tablename__ = "tenants"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    guaranteed_slots: Mapped[int] = mapped_column(Integer, default=0)
    limit_slots: Mapped[int | None] = mapped_column(Integer, nullable=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    created_at: Mapped[float] = mapped_column(Float)
    # storage quotas set by admins; NULL: the server's default (trainhub.core.limits)
    max_checkpoint_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_trial_storage_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_storage_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class UserRow(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[float] = mapped_column(Float)


class MembershipRow(Base):
    __tablename__ = "memberships"
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(16))


class TokenRow(Base):
    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128), default="")
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), nullable=True, index=True
    )
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ExperimentRow(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    project: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec_yaml: Mapped[str] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    context_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    context_size: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the best value of the searcher's metric any trial reported, and the same as a rank that
    # sorts best first in ascending order whatever the mode (value for min, -value for max);
    # written only by offer_experiment_best (migration 0011)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_rank: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)


class TrialRow(Base):
    __tablename__ = "trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON)
    priority: Mapped[str] = mapped_column(String(16))
    submitted_at: Mapped[float] = mapped_column(Float)
    queued_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    pending_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    num_attempts: Mapped[int] = mapped_column(Integer, default=0)
    num_restarts: Mapped[int] = mapped_column(Integer, default=0)
    # why the trial should checkpoint and stop (cancel, preemption); read by the runtime
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    latest_metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    queue_position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # run time and slot-seconds of the trial's ended attempts (the scheduler's attained service)
    run_time_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    attained_service: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # run time the latest checkpoint holds (where the next attempt resumes)
    progress_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # the number of the last committed change to what the scheduler reads of this trial (its
    # scheduling columns, attempts, checkpoints): the control loop reads what changed since
    # its last tick (adapters/db/changes.py, ADR 0024)
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0", index=True)
    # what the trial wrote beyond the API's checkpoints (issue 24, migration 0017): metric
    # points stored and those dropped over its cap; bytes of its checkpoint folder, home and
    # scratch as its nodes last measured them
    metric_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    metric_points_dropped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    disk_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ChangeCounterRow(Base):
    """The last number given to a change of the trials (one row, ``name`` "trials")."""

    __tablename__ = "change_counters"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class AttemptRow(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("trial_id", "number"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    placement: Mapped[list[Any]] = mapped_column(JSON)
    restored_checkpoint_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_slots: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    exit_codes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    terminate_sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class MetricRow(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("trial_id", "step"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    step: Mapped[int] = mapped_column(BigInteger)
    attempt: Mapped[int] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)
    reported_at: Mapped[float] = mapped_column(Float)


class MetricChunkRow(Base):
    """The points of one metric from one ingested batch, as packed columns (little-endian
    int64 steps, float64 values): a chart's first read of a big trial reads a few thousand of
    these instead of a row per step (migration 0011)."""

    __tablename__ = "metric_chunks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    num_points: Mapped[int] = mapped_column(Integer)
    steps: Mapped[bytes] = mapped_column(LargeBinary)
    values: Mapped[bytes] = mapped_column(LargeBinary)


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    step: Mapped[int] = mapped_column(BigInteger)
    attempt: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    storage_key: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)


class TrialEventRow(Base):
    __tablename__ = "trial_events"
    __table_args__ = (Index("ix_trial_events_trial_time", "trial_id", "time"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
