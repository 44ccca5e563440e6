"""per-experiment Python environments: the cache's records and which experiment uses which

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("request_key", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("requirements", sa.JSON(), nullable=False),
        sa.Column("packages", sa.JSON(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("built_at", sa.Float(), nullable=True),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.Column("num_builds", sa.Integer(), nullable=False),
        sa.Column("num_uses", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("build_s", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("build_log", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("request_key"),
    )
    op.create_index("ix_environments_key", "environments", ["key"])
    op.create_table(
        "experiment_environments",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("request_key", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"]),
        sa.PrimaryKeyConstraint("experiment_id"),
    )
    op.create_index(
        "ix_experiment_environments_request_key", "experiment_environments", ["request_key"]
    )


def downgrade() -> None:
    op.drop_index("ix_experiment_environments_request_key", "experiment_environments")
    op.drop_table("experiment_environments")
    op.drop_index("ix_environments_key", "environments")
    op.drop_table("environments")
