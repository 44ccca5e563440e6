"""node controls (cordon, drain) and node health history

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_controls",
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("node_id"),
    )
    op.create_table(
        "node_health_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_node_health_events_node_id", "node_health_events", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_node_health_events_node_id", table_name="node_health_events")
    op.drop_table("node_health_events")
    op.drop_table("node_controls")
