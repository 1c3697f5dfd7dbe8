"""multi-node jobs: jobs.nodes and the job_nodes table (one row per node slot of an attempt)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from service.db.models import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
    op.create_table(
        "job_nodes",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("node_rank", sa.Integer(), primary_key=True),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("addr", sa.String(200), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("claimed_at", UTCDateTime(), nullable=False),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("stop", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("exited_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_job_nodes_lease_expires_at", "job_nodes", ["lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_job_nodes_lease_expires_at", table_name="job_nodes")
    op.drop_table("job_nodes")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("nodes")
