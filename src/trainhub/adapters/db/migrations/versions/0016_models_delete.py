"""model_versions: when a version was deleted (deleted_at), so that its number is never given
to another version (a spec pinned to NAME:V must never fetch other weights)

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("model_versions", "deleted_at")
