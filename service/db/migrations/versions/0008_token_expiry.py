"""tokens: expires_at (optional expiry) and revoked_at

Revision ID: 0008t
Revises: 0007e
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from service.db.models import UTCDateTime

revision = "0008t"
down_revision = "0007e"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("revoked_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("expires_at")
