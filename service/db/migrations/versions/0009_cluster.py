"""the cluster manager's view of a job's attempt: jobs.cluster (JSON)

A job run by a cluster launcher (Slurm, :mod:`worker.slurm`) keeps the cluster's job id,
its node list, state, waiting reason and restarts there; None for the local launcher.

Revision ID: 0009s
Revises: 0008t
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0009s"
down_revision = "0008t"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cluster", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cluster")
