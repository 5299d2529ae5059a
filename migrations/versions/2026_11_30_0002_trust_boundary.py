"""Trust boundary: tenant-bound workers, output as bytes kept once, a keyed audit chain.

Why each change:
- `workers.tenants`: a worker token minted for tenants serves only their jobs; placement reads
  the tenants from the worker's row.
- `job_output.data` becomes bytea: a job's output is bytes (NULs and invalid UTF-8 included),
  which Postgres text cannot hold. Existing rows are converted losslessly from their UTF-8 text.
- `job_output.seq` with a unique (job_id, epoch, seq): workers resend reports the server has not
  acknowledged, and a resend must not duplicate output. Existing rows take their id as seq.
- `audit_anchor`: where the keyed (HMAC) chain begins, signed with the key, so entries sealed
  before this version keep verifying under plain SHA-256 and the boundary cannot be moved.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "workers",
        sa.Column(
            "tenants", postgresql.ARRAY(sa.String(length=128)), server_default="{}", nullable=False
        ),
    )
    op.add_column("job_output", sa.Column("seq", sa.BigInteger(), nullable=True))
    op.execute("UPDATE job_output SET seq = id")
    op.alter_column("job_output", "seq", nullable=False)
    op.alter_column(
        "job_output",
        "data",
        type_=sa.LargeBinary(),
        existing_type=sa.Text(),
        postgresql_using="convert_to(data, 'UTF8')",
    )
    op.create_unique_constraint(
        op.f("uq_job_output_job_id_epoch_seq"), "job_output", ["job_id", "epoch", "seq"]
    )
    op.create_table(
        "audit_anchor",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("keyed_from", sa.BigInteger(), nullable=False),
        sa.Column("mac", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_anchor")),
    )


def downgrade() -> None:
    op.drop_table("audit_anchor")
    op.drop_constraint(op.f("uq_job_output_job_id_epoch_seq"), "job_output", type_="unique")
    # Bytes that are not UTF-8 (a NUL included) cannot go back to text: those rows are kept in
    # Postgres' escape form (\\000), visibly.
    op.execute(
        "CREATE FUNCTION pg_temp.berth_text(b bytea) RETURNS text LANGUAGE plpgsql AS $$ "
        "BEGIN RETURN convert_from(b, 'UTF8'); "
        "EXCEPTION WHEN others THEN RETURN encode(b, 'escape'); END $$"
    )
    op.alter_column(
        "job_output",
        "data",
        type_=sa.Text(),
        existing_type=sa.LargeBinary(),
        postgresql_using="pg_temp.berth_text(data)",
    )
    op.drop_column("job_output", "seq")
    op.drop_column("workers", "tenants")
