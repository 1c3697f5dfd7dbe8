"""models: state (inspecting / ready / failed) and error; one model per published job;
jobs: waiting_note

``jobs.waiting_note`` says why a woken worker did not start a queued job (its disk below
``min_free_disk_mb``, ``worker.runner``); the claim clears it.

A publish answers at once with the model ``inspecting`` and inspects the weights after
the answer (``service.api.models``); ``state`` and ``error`` say where that stands. A
partial unique index on ``source`` for published checkpoints (``job:<id>``; uploads are
``upload``) makes two concurrent publishes of one job one model: the second insert loses
and answers with the first's model. Earlier duplicates (a job published twice before
publishing was idempotent) keep their rows, their source suffixed ``#<model id>``.

Revision ID: 0010p
Revises: 0009s
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0010p"
down_revision = "0009s"
branch_labels = None
depends_on = None

_PUBLISHED = sa.text("source <> 'upload'")


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("state", sa.String(16), nullable=False,
                                   server_default="ready"))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
    models = sa.table("models", sa.column("id", sa.String), sa.column("source", sa.String))
    conn = op.get_bind()
    first: dict[str, str] = {}
    for model_id, source in conn.execute(
            sa.select(models.c.id, models.c.source).where(models.c.source != "upload")
            .order_by(models.c.id)):
        if source in first:
            conn.execute(models.update().where(models.c.id == model_id)
                         .values(source=f"{source}#{model_id}"[:64]))
        else:
            first[source] = model_id
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("waiting_note", sa.Text(), nullable=True))
    op.create_index("uq_models_published_source", "models", ["source"], unique=True,
                    sqlite_where=_PUBLISHED, postgresql_where=_PUBLISHED)


def downgrade() -> None:
    op.drop_index("uq_models_published_source", table_name="models")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("waiting_note")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("error")
        batch.drop_column("state")
