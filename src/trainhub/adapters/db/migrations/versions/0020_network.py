"""the network as a tenant resource (issue 30): bytes each attempt's ranks sent and received
per scope and UTC day (docs/adr/0045), and nodes' topology labels (block, rack)

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "network_usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("sent_bytes", sa.BigInteger(), nullable=False),
        sa.Column("received_bytes", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "rank", "scope", "day"),
    )
    op.create_index("ix_network_usage_attempt_id", "network_usage", ["attempt_id"])
    op.create_index("ix_network_usage_trial_id", "network_usage", ["trial_id"])
    op.create_index("ix_network_usage_day", "network_usage", ["day"])
    op.create_table(
        "node_labels",
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("node_id"),
    )


def downgrade() -> None:
    op.drop_table("node_labels")
    op.drop_index("ix_network_usage_day", table_name="network_usage")
    op.drop_index("ix_network_usage_trial_id", table_name="network_usage")
    op.drop_index("ix_network_usage_attempt_id", table_name="network_usage")
    op.drop_table("network_usage")
