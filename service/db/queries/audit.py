"""SQL for the audit log: append is a plain insert; sealing chains entries in batches."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.schema import audit


async def append(conn: AsyncConnection, entries: Sequence[dict[str, Any]]) -> None:
    """Insert entries (caller, action, target, tenant, request_id, detail) unsealed."""
    if entries:
        await conn.execute(insert(audit), list(entries))


async def recent(
    conn: AsyncConnection, *, tenants: frozenset[str] | None, limit: int
) -> list[dict[str, Any]]:
    q = (
        select(
            audit.c.id,
            audit.c.at,
            audit.c.caller,
            audit.c.action,
            audit.c.target,
            audit.c.tenant,
            audit.c.request_id,
            audit.c.detail,
            audit.c.seq,
        )
        .order_by(audit.c.id.desc())
        .limit(limit)
    )
    if tenants is not None:
        q = q.where(audit.c.tenant.in_(sorted(tenants)))
    return [dict(r._mapping) for r in await conn.execute(q)]
