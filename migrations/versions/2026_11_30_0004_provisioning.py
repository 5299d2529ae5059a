"""Provisioning: the installation id, join tokens, two-phase credential rotation, and the
provisioning loop's intent per worker and health per pool.

Why each:
- `installation`: provisioned workers carry this id as a label, so a new leader adopts what an
  old one started (and never touches another installation's). Made here, once, and kept.
- `join_tokens`: one-time tokens a node trades for its own credential; only hashes are kept.
- `tokens.next_hash`: a worker's credential is rotated in two phases (send, confirm, replace),
  and both must be valid between the two.
- `provisioned` and `pool_health`: the loop writes what it is about to start before it calls
  the provider, so a leader killed mid-pass leaves nothing the next one cannot reconcile; start
  failures back off per pool and say why.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 11:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "installation",
        sa.Column(
            "id",
            postgresql.UUID(as_uuid=False),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_installation")),
    )
    op.execute("INSERT INTO installation DEFAULT VALUES")
    op.add_column("tokens", sa.Column("next_hash", sa.LargeBinary(), nullable=True))
    op.add_column("tokens", sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tokens", sa.Column("pool", sa.String(length=128), nullable=True))
    op.add_column(
        "tokens", sa.Column("labels", postgresql.ARRAY(sa.String(length=256)), nullable=True)
    )
    op.create_unique_constraint(op.f("uq_tokens_next_hash"), "tokens", ["next_hash"])
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column(
            "labels", postgresql.ARRAY(sa.String(length=256)), server_default="{}", nullable=False
        ),
        sa.Column(
            "tenants", postgresql.ARRAY(sa.String(length=128)), server_default="{}", nullable=False
        ),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spent_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_join_tokens")),
        sa.UniqueConstraint("hash", name=op.f("uq_join_tokens_hash")),
    )
    op.create_table(
        "provisioned",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), server_default="starting", nullable=False),
        sa.Column("provider_id", sa.String(length=256), server_default="", nullable=False),
        sa.Column("detail", sa.Text(), server_default="", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "busy_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_provisioned")),
    )
    op.create_index(
        "ix_provisioned_active",
        "provisioned",
        ["pool"],
        unique=False,
        postgresql_where=sa.text("state NOT IN ('stopped', 'failed')"),
    )
    op.create_table(
        "pool_health",
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_try_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), server_default="", nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("pool", name=op.f("pk_pool_health")),
    )


def downgrade() -> None:
    op.drop_table("pool_health")
    op.drop_index("ix_provisioned_active", table_name="provisioned")
    op.drop_table("provisioned")
    op.drop_table("join_tokens")
    op.drop_constraint(op.f("uq_tokens_next_hash"), "tokens", type_="unique")
    op.drop_column("tokens", "labels")
    op.drop_column("tokens", "pool")
    op.drop_column("tokens", "rotated_at")
    op.drop_column("tokens", "next_hash")
    op.drop_table("installation")
