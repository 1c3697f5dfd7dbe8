"""models: the ONNX export of a registered model (state, error, info, times)

``POST /v1/models/{id}/export`` records the request on the model (``onnx_state``
``exporting``, ``onnx_requested_at``) and sends ``export_model(model_id)`` to a worker;
the worker claims it (``onnx_started_at``), exports the stored ``.pt`` with the engine
(checked by onnxruntime) to ``<model_root>/<id>.onnx`` and records ``ready`` with the
export's facts in ``onnx_info`` (the check figure, layout, opset, sha256, bytes), or
``failed`` with the reason in ``onnx_error``. NULL ``onnx_state``: never exported.

Revision ID: 0011e
Revises: 0010p
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

from service.db.models import UTCDateTime

revision = "0011e"
down_revision = "0010p"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("onnx_state", sa.String(16), nullable=True))
        batch.add_column(sa.Column("onnx_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("onnx_info", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("onnx_requested_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("onnx_started_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        for column in ("onnx_started_at", "onnx_requested_at", "onnx_info", "onnx_error",
                       "onnx_state"):
            batch.drop_column(column)
