"""fair-share scheduling: a per-user cap on running jobs, the re-send clock, the claim index

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from service.db.models import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: the setting max_running_per_user; 0: no cap
    op.add_column("users", sa.Column("max_running", sa.Integer(), nullable=True))
    # when the job's run_job message was last sent (the reaper's re-send clock; enqueued_at
    # stays the time it entered the queue, which is the scheduler's age)
    op.add_column("jobs", sa.Column("sent_at", UTCDateTime(), nullable=True))
    op.create_index("ix_jobs_queue_status", "jobs", ["queue", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_queue_status", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("sent_at")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("max_running")
