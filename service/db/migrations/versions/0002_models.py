"""models: registered weights files (uploads and published job checkpoints)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from service.db.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id"), nullable=False,
                  index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("size", sa.String(16), nullable=False),
        sa.Column("nc", sa.Integer(), nullable=False),
        sa.Column("names", sa.JSON(), nullable=False),
        sa.Column("params", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("imgsz", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("models")
