"""trials: what a trial wrote beyond the API's checkpoints (issue 24): metric points stored
and dropped over the trial's cap, and the bytes of its checkpoint folder, home and scratch
as its nodes last measured them

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_COLUMNS = ("metric_points", "metric_points_dropped", "disk_bytes")


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for name in _COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    # in place, as 0013 does (a table copy would trip the foreign keys of attempts)
    for name in reversed(_COLUMNS):
        op.drop_column("trials", name)
