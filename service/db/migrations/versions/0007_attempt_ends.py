"""how attempts end: jobs.end_class, jobs.end_reason and jobs.infra_retries

``end_class`` is ``infrastructure``, ``job`` or ``user`` (the last end of an attempt:
worker or node lost, outage, OOM kill, disk full, hang / config, data or code error /
cancel), ``end_reason`` says why; ``infra_retries`` counts the re-queues after
infrastructure ends (their own budget, the setting ``max_infra_retries``).

Revision ID: 0007e
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007e"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("end_class", sa.String(16), nullable=True))
        batch.add_column(sa.Column("end_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("infra_retries", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("infra_retries")
        batch.drop_column("end_reason")
        batch.drop_column("end_class")
