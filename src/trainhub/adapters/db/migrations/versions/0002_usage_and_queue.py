"""slots held by each attempt (usage accounting); queue position of pending trials

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("num_slots", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("queue_position", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("queue_position")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("num_slots")
