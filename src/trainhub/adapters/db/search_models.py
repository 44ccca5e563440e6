"""Tables of searches and steered trials (migration 0005). Optuna keeps its own tables apart."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.adapters.db.models import Base


class SearchRow(Base):
    __tablename__ = "searches"
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    state: Mapped[str] = mapped_column(String(16), index=True)
    max_trials: Mapped[int] = mapped_column(Integer)
    max_concurrent_trials: Mapped[int] = mapped_column(Integer)
    rng_state: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)


class SteeredTrialRow(Base):
    __tablename__ = "steered_trials"
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    backend_id: Mapped[int | None] = mapped_column(Integer, nullable=True, unique=True)
    number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reported_step: Mapped[int] = mapped_column(Integer, default=-1)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    told: Mapped[bool] = mapped_column(Boolean, default=False)
    stop_intent: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stop_detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    warm_start_checkpoint_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    parent_trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    due_step: Mapped[int] = mapped_column(Integer, default=0)
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)


class SpecTemplateRow(Base):
    __tablename__ = "spec_templates"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    spec_yaml: Mapped[str] = mapped_column(Text)
    context_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
