"""SQL for secrets: ciphertext only; listing never selects it."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.schema import secrets


async def put(
    conn: AsyncConnection, *, tenant: str, name: str, nonce: bytes, ciphertext: bytes, by: str
) -> None:
    stmt = pg_insert(secrets).values(
        tenant=tenant, name=name, nonce=nonce, ciphertext=ciphertext, created_by=by
    )
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[secrets.c.tenant, secrets.c.name],
            set_={
                "nonce": stmt.excluded.nonce,
                "ciphertext": stmt.excluded.ciphertext,
                "created_by": stmt.excluded.created_by,
                "updated_at": func.now(),
            },
        )
    )


async def names(conn: AsyncConnection, *, tenants: set[str] | None) -> list[dict[str, Any]]:
    """Names, owners (tenant, "*" for all, "" for the system) and authors: never values."""
    q = select(secrets.c.name, secrets.c.tenant, secrets.c.created_by, secrets.c.updated_at)
    if tenants is not None:
        q = q.where(secrets.c.tenant.in_(sorted(tenants)))
    rows = await conn.execute(q.order_by(secrets.c.tenant, secrets.c.name))
    return [dict(r._mapping) for r in rows]


async def remove(conn: AsyncConnection, *, tenant: str, name: str) -> bool:
    row = await conn.execute(
        delete(secrets)
        .where(secrets.c.tenant == tenant, secrets.c.name == name)
        .returning(secrets.c.id)
    )
    return row.first() is not None


async def sealed_for(
    conn: AsyncConnection, *, scopes: Sequence[str], names_: Sequence[str]
) -> dict[tuple[str, str], tuple[bytes, bytes]]:
    """(scope, name) -> (nonce, ciphertext) for these names in these scopes (owners)."""
    if not names_:
        return {}
    wanted = [(t, n) for n in names_ for t in scopes]
    rows = await conn.execute(
        select(secrets.c.tenant, secrets.c.name, secrets.c.nonce, secrets.c.ciphertext).where(
            tuple_(secrets.c.tenant, secrets.c.name).in_(wanted)
        )
    )
    return {(r.tenant, r.name): (r.nonce, r.ciphertext) for r in rows}
