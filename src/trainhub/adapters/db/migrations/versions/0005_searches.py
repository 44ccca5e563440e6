"""searches, steered trials (search, pause, prune, warm start) and spec templates

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "searches",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("max_trials", sa.Integer(), nullable=False),
        sa.Column("max_concurrent_trials", sa.Integer(), nullable=False),
        sa.Column("rng_state", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("experiment_id"),
    )
    op.create_index("ix_searches_state", "searches", ["state"])
    op.create_table(
        "steered_trials",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("backend_id", sa.Integer(), nullable=True),
        sa.Column("number", sa.Integer(), nullable=True),
        sa.Column("reported_step", sa.Integer(), nullable=False),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("told", sa.Boolean(), nullable=False),
        sa.Column("stop_intent", sa.String(length=16), nullable=True),
        sa.Column("stop_detail", sa.Text(), nullable=True),
        sa.Column("warm_start_checkpoint_id", sa.Integer(), nullable=True),
        sa.Column("parent_trial_id", sa.Integer(), nullable=True),
        sa.Column("due_step", sa.Integer(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"]),
        sa.PrimaryKeyConstraint("trial_id"),
        sa.UniqueConstraint("backend_id"),
    )
    op.create_index("ix_steered_trials_experiment_id", "steered_trials", ["experiment_id"])
    op.create_table(
        "spec_templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("spec_yaml", sa.Text(), nullable=False),
        sa.Column("context_key", sa.String(length=512), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "name"),
    )


def downgrade() -> None:
    op.drop_table("spec_templates")
    op.drop_index("ix_steered_trials_experiment_id", table_name="steered_trials")
    op.drop_table("steered_trials")
    op.drop_index("ix_searches_state", table_name="searches")
    op.drop_table("searches")
