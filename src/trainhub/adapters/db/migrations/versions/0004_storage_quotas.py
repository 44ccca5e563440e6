"""storage quotas per tenant; 64-bit steps and checkpoint sizes

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_QUOTAS = ("max_checkpoint_bytes", "max_trial_storage_bytes", "max_storage_bytes")


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        for name in _QUOTAS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
    # steps are 64-bit on the wire; a 2 GB checkpoint does not fit in a 32-bit size
    with op.batch_alter_table("metrics") as batch:
        batch.alter_column("step", type_=sa.BigInteger(), existing_type=sa.Integer())
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("step", type_=sa.BigInteger(), existing_type=sa.Integer())
        batch.alter_column("size_bytes", type_=sa.BigInteger(), existing_type=sa.Integer())


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("size_bytes", type_=sa.Integer(), existing_type=sa.BigInteger())
        batch.alter_column("step", type_=sa.Integer(), existing_type=sa.BigInteger())
    with op.batch_alter_table("metrics") as batch:
        batch.alter_column("step", type_=sa.Integer(), existing_type=sa.BigInteger())
    with op.batch_alter_table("tenants") as batch:
        for name in reversed(_QUOTAS):
            batch.drop_column(name)
