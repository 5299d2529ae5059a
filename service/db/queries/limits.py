"""SQL for limits: operator overrides of config keys, with who set them, when and why.

Functions take the connection they run on and never commit. A change is followed by a NOTIFY
on LIMITS_CHANNEL in the same transaction, so every server re-reads the table once it commits.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.records import Record
from service.db.schema import limits
from service.db.statements import sql

LIMITS_CHANNEL = "berth_limits_v1"


@dataclass(frozen=True, slots=True)
class LimitRecord(Record):
    key: str
    value: Any  # JSON: an int or a float, as core.limits.parse made it
    reason: str
    set_by: str
    set_at: datetime


_COLUMNS = (limits.c.key, limits.c.value, limits.c.reason, limits.c.set_by, limits.c.set_at)


async def put(
    conn: AsyncConnection, *, key: str, value: float, reason: str, by: str
) -> tuple[LimitRecord, LimitRecord | None]:
    """Set `key` (insert or replace): the new row, and the one it replaced (None: was unset)."""
    previous = await get(conn, key=key, for_update=True)
    stmt = pg_insert(limits).values(key=key, value=value, reason=reason, set_by=by)
    row = await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[limits.c.key],
            set_={
                "value": stmt.excluded.value,
                "reason": stmt.excluded.reason,
                "set_by": stmt.excluded.set_by,
                "set_at": func.now(),
            },
        ).returning(*_COLUMNS)
    )
    return LimitRecord.of(row.one()), previous


async def get(conn: AsyncConnection, *, key: str, for_update: bool = False) -> LimitRecord | None:
    """The row for `key`; None when it is not set."""
    q = select(*_COLUMNS).where(limits.c.key == key)
    row = (await conn.execute(q.with_for_update() if for_update else q)).first()
    return LimitRecord.of(row) if row is not None else None


async def remove(conn: AsyncConnection, *, key: str) -> LimitRecord | None:
    """Unset `key`: the row removed, or None when it was not set."""
    row = await conn.execute(delete(limits).where(limits.c.key == key).returning(*_COLUMNS))
    found = row.first()
    return LimitRecord.of(found) if found is not None else None


async def list_all(conn: AsyncConnection) -> list[LimitRecord]:
    """Every limit set, by key. The table holds a few dozen rows at most: servers read it whole."""
    rows = await conn.execute(select(*_COLUMNS).order_by(limits.c.key))
    return [LimitRecord.of(r) for r in rows]


async def notify(conn: AsyncConnection, key: str) -> None:
    """Tell every server the limits changed (delivered when the transaction commits)."""
    await conn.execute(sql("SELECT pg_notify(:ch, :key)"), {"ch": LIMITS_CHANNEL, "key": key})
