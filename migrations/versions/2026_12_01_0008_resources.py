"""Per-job resources (cpus, memory, GPUs), each worker's declared capacity, and what leases hold.

Why each:
- `jobs.cpus` / `memory_mb` / `gpus`: what a job asked for (SPEC section 4, "Resources"); 0
  reserves nothing, so every existing job places as before.
- `leases.cpus` / `memory_mb` / `gpus`: the request, copied when the lease is granted, so that
  what a worker has left is a sum over its live leases alone (no join to jobs on the claim path).
- `workers.capacity`: what the worker declared at hello (`berth worker --cpus --memory --gpus`,
  default the host's): `{"cpus": float, "memory_mb": int, "gpus": int}`; `{}` (a worker of an
  older berth) offers none, so it takes only jobs that ask for nothing.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _resources(table: str) -> None:
    op.add_column(table, sa.Column("cpus", sa.Float(), nullable=False, server_default="0"))
    op.add_column(
        table, sa.Column("memory_mb", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.add_column(table, sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"))


def upgrade() -> None:
    _resources("jobs")
    _resources("leases")
    op.add_column("workers", sa.Column("capacity", JSONB(), nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("workers", "capacity")
    for table in ("leases", "jobs"):
        for column in ("gpus", "memory_mb", "cpus"):
            op.drop_column(table, column)
