"""experiments: best value of the searcher's metric and its sort rank; indexes for the list's
sorts and user filter

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("best_value", sa.Float(), nullable=True))
        batch.add_column(sa.Column("best_rank", sa.Float(), nullable=True))
    op.create_index("ix_experiments_best_rank", "experiments", ["best_rank"])
    op.create_index("ix_experiments_name", "experiments", ["name"])
    op.create_index("ix_experiments_owner_id", "experiments", ["owner_id"])


def downgrade() -> None:
    op.drop_index("ix_experiments_owner_id", table_name="experiments")
    op.drop_index("ix_experiments_name", table_name="experiments")
    op.drop_index("ix_experiments_best_rank", table_name="experiments")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("best_rank")
        batch.drop_column("best_value")
