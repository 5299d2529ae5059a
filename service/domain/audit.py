"""Recording writes: every write is signed with its caller, in the transaction that makes it."""

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth.callers import Caller
from service.core import audit_chain
from service.db.engine import Database
from service.db.queries import audit as audit_q


async def record(
    conn: AsyncConnection,
    caller: Caller | str,
    action: str,
    target: str,
    *,
    tenant: str | None = None,
    request_id: str = "",
    **detail: Any,  # noqa: ANN401  (JSON-able details, stored as jsonb)
) -> None:
    await audit_q.append(
        conn,
        [
            {
                "caller": str(caller),
                "action": action,
                "target": target[:256],  # the column's width: a long target is cut, not refused
                "tenant": tenant,
                "request_id": request_id,
                "detail": detail,
            }
        ],
    )


async def seal(db: Database) -> int:
    """Seal a batch of new entries into the chain (the leader does this every pass)."""
    total = 0
    while True:
        async with db.begin() as conn:
            n = await audit_q.seal_batch(conn)
        total += n
        if n == 0:
            return total


async def verify(db: Database) -> tuple[str | None, int, int]:
    """Walk the chain: (first break or None, sealed entries checked, entries not yet sealed)."""
    checked = 0
    after = 0
    entries: list[dict[str, Any]] = []
    async with db.begin() as conn:
        pending = await audit_q.unsealed_count(conn)
        while True:
            batch = await audit_q.sealed(conn, after_seq=after, limit=5000)
            if not batch:
                break
            entries.extend(batch)
            after = batch[-1]["seq"]
    checked = len(entries)
    return audit_chain.first_break(entries), checked, pending


async def recent(db: Database, caller: Caller, *, limit: int) -> list[dict[str, Any]]:
    async with db.begin() as conn:
        return await audit_q.recent(conn, tenants=caller.tenant_filter(), limit=limit)
