"""Artifacts: `cas_refs`, the references through which tenants reach blobs in the store.

Why: the store is content-addressed and shared by every tenant, so knowing a hash must not be
enough to read a blob (SPEC 3). A tenant reads a blob only through a reference it holds: its
upload, or an input, output or log of one of its jobs. The same rows tell the collector which
blobs are still wanted: a reference holds its blob while its job runs (derived from
`jobs.finished_at`, so no job path has to remember to end it) and for `[cas] gc_days` after its
job or upload ended. `job_id` is SET NULL when a job row goes, so references never block one.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cas_refs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("sha256", sa.CHAR(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("what", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_cas_refs_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cas_refs")),
    )
    op.create_index("ix_cas_refs_tenant_sha256", "cas_refs", ["tenant", "sha256"], unique=False)
    op.create_index("ix_cas_refs_sha256", "cas_refs", ["sha256"], unique=False)
    op.create_index("ix_cas_refs_job_id", "cas_refs", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_cas_refs_job_id", table_name="cas_refs")
    op.drop_index("ix_cas_refs_sha256", table_name="cas_refs")
    op.drop_index("ix_cas_refs_tenant_sha256", table_name="cas_refs")
    op.drop_table("cas_refs")
