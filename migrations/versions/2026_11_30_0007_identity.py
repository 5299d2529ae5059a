"""Worker identity, audit rows signed on insert, a lease history that goes with its worker.

Why each:
- `workers.identity`: a worker row belongs to the credential that attached it (`token:<id>`: a
  berth token or a joined worker's credential, the same across its rotations; `proxy:<digest>`:
  the proxy worker rule that matched). Another identity may not attach under a name that is
  live or holds leases, and held leases are resumed only for the identity that leased them.
  Existing rows take the identity of the live token of their name (token mode); rows with none
  keep "" and are adopted by the next credential that attaches under their name. The token
  `serve` of older berths' built-in worker is revoked: each server's has its own now.
- `leases.worker_id ... ON DELETE CASCADE`: a worker row that is forgotten or taken over by
  another identity (only when it holds no live lease) takes its ended leases' history with it,
  so a row is never shared by two identities.
- `audit.mac`: a nonce and an HMAC over the entry's content, made by the server when it inserts
  the entry, under a key derived from the secret key (never in the database). The sealer chains
  only entries whose MAC holds and names any other: a database writer without the key cannot
  get an entry of its own sealed. Unique, so an entry cannot be replayed as a copy.
  Entries left unsealed by an older berth have no MAC: they are named too (see the upgrade
  notes in docs/operations.md).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The built-in worker's token of older berths ("serve", re-minted at every start): each
    # server's built-in worker now has a credential of its own, so that one serves nobody.
    op.execute(
        """
        UPDATE tokens SET revoked_at = now()
        WHERE name = 'serve' AND kind = 'worker' AND created_by = 'service:berth'
          AND revoked_at IS NULL
        """
    )
    op.add_column(
        "workers", sa.Column("identity", sa.String(length=200), server_default="", nullable=False)
    )
    op.execute(
        """
        UPDATE workers SET identity = 'token:' || t.id
        FROM tokens t
        WHERE t.name = workers.name AND t.revoked_at IS NULL AND t.kind = 'worker'
        """
    )
    op.drop_constraint("fk_leases_worker_id_workers", "leases", type_="foreignkey")
    op.create_foreign_key(
        op.f("fk_leases_worker_id_workers"),
        "leases",
        "workers",
        ["worker_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.add_column("audit", sa.Column("mac", sa.LargeBinary(), nullable=True))
    op.create_unique_constraint(op.f("uq_audit_mac"), "audit", ["mac"])


def downgrade() -> None:
    op.drop_constraint(op.f("uq_audit_mac"), "audit", type_="unique")
    op.drop_column("audit", "mac")
    op.drop_constraint(op.f("fk_leases_worker_id_workers"), "leases", type_="foreignkey")
    op.create_foreign_key(
        op.f("fk_leases_worker_id_workers"), "leases", "workers", ["worker_id"], ["id"]
    )
    op.drop_column("workers", "identity")
