"""SQL for join tokens: one-time, hashed, spent in the statement that checks them."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.schema import join_tokens, tokens


async def create(
    conn: AsyncConnection,
    *,
    digest: bytes,
    name: str,
    pool: str,
    labels: Sequence[str],
    tenants: Sequence[str],
    created_by: str,
    expires_seconds: float,
) -> dict[str, Any]:
    row = (
        await conn.execute(
            insert(join_tokens)
            .values(
                hash=digest,
                name=name,
                pool=pool,
                labels=list(labels),
                tenants=list(tenants),
                created_by=created_by,
                expires_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, expires_seconds),
            )
            .returning(join_tokens.c.name, join_tokens.c.pool, join_tokens.c.expires_at)
        )
    ).one()
    return dict(row._mapping)


async def name_taken(conn: AsyncConnection, name: str) -> bool:
    """A live token, or an unspent unexpired join token, already has this name."""
    live = select(tokens.c.id).where(tokens.c.name == name, tokens.c.revoked_at.is_(None))
    pending = select(join_tokens.c.id).where(
        join_tokens.c.name == name,
        join_tokens.c.spent_at.is_(None),
        join_tokens.c.expires_at > func.now(),
    )
    found = await conn.execute(live.union_all(pending).limit(1))
    return found.first() is not None


async def spend(conn: AsyncConnection, digest: bytes) -> dict[str, Any] | None:
    """Spend the join token with this hash if it is unspent and unexpired: one use, ever."""
    row = (
        await conn.execute(
            update(join_tokens)
            .where(
                join_tokens.c.hash == digest,
                join_tokens.c.spent_at.is_(None),
                join_tokens.c.expires_at > func.now(),
            )
            .values(spent_at=func.now())
            .returning(
                join_tokens.c.name,
                join_tokens.c.pool,
                join_tokens.c.labels,
                join_tokens.c.tenants,
                join_tokens.c.created_by,
            )
        )
    ).one_or_none()
    return dict(row._mapping) if row else None


async def why_unusable(conn: AsyncConnection, digest: bytes) -> str:
    """Why a join token could not be spent, in words for the refused worker."""
    row = (
        await conn.execute(
            select(
                join_tokens.c.spent_at, (join_tokens.c.expires_at <= func.now()).label("expired")
            ).where(join_tokens.c.hash == digest)
        )
    ).one_or_none()
    if row is None:
        return "unknown join token"
    if row.spent_at is not None:
        return "this join token was already used (it is good for one attach only)"
    return "this join token has expired"
