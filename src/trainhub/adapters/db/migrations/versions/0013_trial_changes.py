"""trials: the number of the last change the scheduler reads (change_seq) and its counter, so
the control loop reads only the trials changed since its last tick (ADR 0024)

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(
            sa.Column("change_seq", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.create_index("ix_trials_change_seq", "trials", ["change_seq"])
    counters = op.create_table(
        "change_counters",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(counters, [{"name": "trials", "value": 0}])


def downgrade() -> None:
    op.drop_table("change_counters")
    op.drop_index("ix_trials_change_seq", table_name="trials")
    # in place (SQLite 3.35 and later drop a column without copying the table, whose copy the
    # foreign keys of attempts and checkpoints would refuse)
    op.drop_column("trials", "change_seq")
