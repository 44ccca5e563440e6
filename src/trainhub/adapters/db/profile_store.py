"""Profiles of running trials and their per-rank results, in the database (migration 0011)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Engine, Float, ForeignKey, Integer, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base
from trainhub.service.profiling import Profile, ProfileState, RankProfile


class ProfileRow(Base):
    __tablename__ = "profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    tenant: Mapped[str] = mapped_column(String(64))
    steps: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    requested_by: Mapped[str] = mapped_column(String(64))
    requested_at: Mapped[float] = mapped_column(Float)
    attempt: Mapped[int] = mapped_column(Integer)
    world_size: Mapped[int] = mapped_column(Integer)
    detail: Mapped[str] = mapped_column(Text, default="")


class ProfileRankRow(Base):
    __tablename__ = "profile_ranks"
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    top_ops: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    trace_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    trace_bytes: Mapped[int] = mapped_column(Integer)
    uploaded_at: Mapped[float] = mapped_column(Float)


def _profile(row: ProfileRow, ranks: list[ProfileRankRow]) -> Profile:
    return Profile(
        id=row.id,
        trial_id=row.trial_id,
        tenant=row.tenant,
        steps=row.steps,
        state=ProfileState(row.state),
        requested_by=row.requested_by,
        requested_at=row.requested_at,
        attempt=row.attempt,
        world_size=row.world_size,
        detail=row.detail,
        ranks=[
            RankProfile(r.rank, list(r.top_ops), r.trace_key, r.trace_bytes, r.uploaded_at)
            for r in sorted(ranks, key=lambda r: r.rank)
        ],
    )


class SqlProfileStore:
    """:class:`~trainhub.service.profiling.ProfileStore` on SQLAlchemy; short transactions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add_profile(self, profile: Profile) -> Profile:
        with Session(self.engine) as session, session.begin():
            row = ProfileRow(
                trial_id=profile.trial_id,
                tenant=profile.tenant,
                steps=profile.steps,
                state=profile.state.value,
                requested_by=profile.requested_by,
                requested_at=profile.requested_at,
                attempt=profile.attempt,
                world_size=profile.world_size,
                detail=profile.detail,
            )
            session.add(row)
            session.flush()
            return _profile(row, [])

    def get_profile(self, profile_id: int) -> Profile | None:
        with Session(self.engine) as session:
            row = session.get(ProfileRow, profile_id)
            if row is None:
                return None
            ranks = session.scalars(
                select(ProfileRankRow).where(ProfileRankRow.profile_id == profile_id)
            ).all()
            return _profile(row, list(ranks))

    def list_profiles(self, trial_id: int, limit: int) -> list[Profile]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(ProfileRow)
                .where(ProfileRow.trial_id == trial_id)
                .order_by(ProfileRow.id.desc())
                .limit(limit)
            ).all()
            ids = [r.id for r in rows]
            ranks = session.scalars(
                select(ProfileRankRow).where(ProfileRankRow.profile_id.in_(ids))
            ).all()
            return [_profile(r, [k for k in ranks if k.profile_id == r.id]) for r in rows]

    def set_state(self, profile_id: int, state: ProfileState, detail: str = "") -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(ProfileRow, profile_id)
            if row is not None:
                row.state = state.value
                row.detail = detail

    def put_rank(self, profile_id: int, result: RankProfile) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(ProfileRankRow, (profile_id, result.rank))
            if row is None:
                row = ProfileRankRow(profile_id=profile_id, rank=result.rank)
                session.add(row)
            row.top_ops = result.top_ops
            row.trace_key = result.trace_key
            row.trace_bytes = result.trace_bytes
            row.uploaded_at = result.uploaded_at
