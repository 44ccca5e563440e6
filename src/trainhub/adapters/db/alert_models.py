"""The table of layer-health alerts (migration 0008): one row per (trial, kind, layer)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.adapters.db.models import Base


class LayerAlertRow(Base):
    __tablename__ = "layer_alerts"
    __table_args__ = (UniqueConstraint("trial_id", "kind", "layer"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    layer: Mapped[str] = mapped_column(String(128))
    first_step: Mapped[int] = mapped_column(BigInteger)  # the step it first fired at
    last_step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # at first_step
    message: Mapped[str] = mapped_column(Text)  # at first_step
    first_at: Mapped[float] = mapped_column(Float)
    last_at: Mapped[float] = mapped_column(Float)
