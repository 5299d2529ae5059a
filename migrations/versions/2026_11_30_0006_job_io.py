"""Job I/O: inputs, outputs, metrics, code and repository by hash, output moved to the store.

Why each:
- `jobs.inputs`, `jobs.python_sha256`, `jobs.repo`: what a job brings, named by hash in the
  artifact store (the lease carries the names, the worker fetches the bytes).
- `jobs.outputs`, `jobs.metrics`: what it leaves (files under $BERTH_OUTPUT, numbers it emitted).
- `job_log_segments`: Postgres keeps only the newest `output_tail_kb` of a job's output; older
  output moves to the store in segments, in order, and `job logs` reads it back from there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("python_sha256", sa.String(length=64), server_default="", nullable=False)
    )
    op.add_column("jobs", sa.Column("inputs", JSONB, server_default="[]", nullable=False))
    op.add_column("jobs", sa.Column("repo", sa.Text(), server_default="", nullable=False))
    op.add_column("jobs", sa.Column("outputs", JSONB, server_default="[]", nullable=False))
    op.add_column("jobs", sa.Column("metrics", JSONB, server_default="{}", nullable=False))
    op.create_table(
        "job_log_segments",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("first_id", sa.BigInteger(), nullable=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_job_log_segments_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_log_segments")),
    )
    op.create_index("ix_job_log_segments_job_id_last_id", "job_log_segments", ["job_id", "last_id"])


def downgrade() -> None:
    op.drop_index("ix_job_log_segments_job_id_last_id", table_name="job_log_segments")
    op.drop_table("job_log_segments")
    for column in ("metrics", "outputs", "repo", "inputs", "python_sha256"):
        op.drop_column("jobs", column)
