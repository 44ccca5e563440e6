"""profiles of running trials and their per-rank results; metrics as packed column chunks

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=64), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_profiles_trial_id", "profiles", ["trial_id"])
    op.create_table(
        "profile_ranks",
        sa.Column("profile_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("top_ops", sa.JSON(), nullable=False),
        sa.Column("trace_key", sa.String(length=512), nullable=True),
        sa.Column("trace_bytes", sa.Integer(), nullable=False),
        sa.Column("uploaded_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["profile_id"], ["profiles.id"]),
        sa.PrimaryKeyConstraint("profile_id", "rank"),
    )

    op.create_table(
        "metric_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("num_points", sa.Integer(), nullable=False),
        sa.Column("steps", sa.LargeBinary(), nullable=False),
        sa.Column("values", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_metric_chunks_trial_id", "metric_chunks", ["trial_id"])


def downgrade() -> None:
    op.drop_index("ix_metric_chunks_trial_id", table_name="metric_chunks")
    op.drop_table("metric_chunks")
    op.drop_table("profile_ranks")
    op.drop_index("ix_profiles_trial_id", table_name="profiles")
    op.drop_table("profiles")
