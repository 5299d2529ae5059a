"""Approvals: a job's request for a person's yes, answered by another member of its tenant.

Why: a job about to take an irreversible step (deploy, delete, spend) asks through its runtime
(`request_approval`) and blocks; people list and answer the requests. The row keeps what the
answer depends on at the time of asking (policy, creator, deadline) so a config change or a
server restart does not change an open request, and the deadline is enforced by the server
from this table (a restart does not lose it). A request is tied to the lease (job_id, epoch)
it was asked under, and closed when that lease ends.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("details", sa.Text(), server_default="", nullable=False),
        sa.Column("state", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("policy", sa.String(length=16), nullable=False),
        sa.Column("job_creator", sa.String(length=200), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("answered_by", sa.String(length=200), nullable=True),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_approvals_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approvals")),
    )
    op.create_index(
        "ix_approvals_pending",
        "approvals",
        ["deadline"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index("ix_approvals_tenant_id", "approvals", ["tenant", "id"], unique=False)
    op.create_index("ix_approvals_job_id", "approvals", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_approvals_job_id", table_name="approvals")
    op.drop_index("ix_approvals_tenant_id", table_name="approvals")
    op.drop_index("ix_approvals_pending", table_name="approvals")
    op.drop_table("approvals")
