"""model_versions: whether a version's weights load into its declared architecture
(weights_fit: true, false, or null where not checked: registered before the check existed, or
with no zoo architecture to check against) and, when not, what does not fit (weights_problem).
Versions registered before are checked by the server after it starts
(RegistryService.recheck_weights); ``trainhub models suggest`` ranks no version known not to
load.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("weights_fit", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("weights_problem", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    op.drop_column("model_versions", "weights_problem")
    op.drop_column("model_versions", "weights_fit")
