"""facts the scheduler needs: run time, attained service and progress per trial; when an
attempt was asked to stop and when it got SIGTERM

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("run_time_s", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("attained_service", sa.Float(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("progress_s", sa.Float(), nullable=False, server_default="0"))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("stop_requested_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("terminate_sent_at", sa.Float(), nullable=True))
    # trials that ran before this revision: run time from their ended attempts' processes,
    # attained service from the slots those attempts held (from placement to end)
    op.execute(
        "UPDATE trials SET "
        "run_time_s = COALESCE((SELECT SUM(a.ended_at - a.started_at) FROM attempts a "
        "WHERE a.trial_id = trials.id AND a.started_at IS NOT NULL "
        "AND a.ended_at IS NOT NULL), 0), "
        "attained_service = COALESCE((SELECT SUM((a.ended_at - a.created_at) * a.num_slots) "
        "FROM attempts a WHERE a.trial_id = trials.id AND a.ended_at IS NOT NULL), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("terminate_sent_at")
        batch.drop_column("stop_requested_at")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("progress_s")
        batch.drop_column("attained_service")
        batch.drop_column("run_time_s")
