"""SQL for the audit log: append is a plain insert; sealing chains entries in batches."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core import audit_chain
from service.db.schema import audit, audit_anchor


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


SEAL_LOCK_KEY = 0x6265727400000002  # serialises sealers if two leaders briefly overlap


async def anchor(conn: AsyncConnection) -> tuple[int, bytes] | None:
    """(keyed_from, mac) when the keyed chain has begun; None before its first keyed seal."""
    row = (
        await conn.execute(select(audit_anchor.c.keyed_from, audit_anchor.c.mac).limit(1))
    ).one_or_none()
    return (row.keyed_from, row.mac) if row else None


async def seal_batch(
    conn: AsyncConnection, *, key: bytes, limit: int = 2000
) -> tuple[int, int, bytes]:
    """Give the oldest unsealed entries their seq and keyed chained hash.

    Returns (how many, the head's seq, the head's hash). The anchor is written first when it is
    missing, in the same transaction, so the keyed part of the chain never begins without one.
    """
    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SEAL_LOCK_KEY})
    seq, previous = await head(conn) or (0, audit_chain.GENESIS)
    if await anchor(conn) is None:
        # Written on the first pass of a keyed server, whether or not anything waits to be
        # sealed: from here on every entry is keyed, and `audit verify` refuses a chain with
        # sealed entries and no anchor (deleting it cannot pass the chain off as plain).
        await conn.execute(
            insert(audit_anchor).values(
                id=1, keyed_from=seq + 1, mac=audit_chain.anchor_mac(key, seq + 1)
            )
        )
    rows = (
        await conn.execute(
            select(*(audit.c[f] for f in audit_chain.FIELDS))
            .where(audit.c.seq.is_(None))
            .order_by(audit.c.id)
            .limit(limit)
            .with_for_update()
        )
    ).all()
    if not rows:
        return 0, seq, previous
    ids, seqs, hashes = [], [], []
    for row in rows:
        seq += 1
        previous = audit_chain.link(previous, seq, dict(row._mapping), key)
        ids.append(row.id)
        seqs.append(seq)
        hashes.append(previous)
    await conn.execute(
        text(
            """
            UPDATE audit SET seq = v.seq, hash = v.hash
            FROM unnest(CAST(:ids AS bigint[]), CAST(:seqs AS bigint[]), CAST(:hashes AS bytea[]))
                AS v(id, seq, hash)
            WHERE audit.id = v.id
            """
        ),
        {"ids": ids, "seqs": seqs, "hashes": hashes},
    )
    return len(rows), seq, previous


async def head(conn: AsyncConnection) -> tuple[int, bytes] | None:
    """The newest sealed entry's (seq, hash)."""
    row = (
        await conn.execute(
            select(audit.c.seq, audit.c.hash)
            .where(audit.c.seq.isnot(None))
            .order_by(audit.c.seq.desc())
            .limit(1)
        )
    ).one_or_none()
    return (row.seq, row.hash) if row else None


async def sealed(conn: AsyncConnection, *, after_seq: int, limit: int) -> list[dict[str, Any]]:
    rows = await conn.execute(
        select(audit.c.seq, audit.c.hash, *(audit.c[f] for f in audit_chain.FIELDS))
        .where(audit.c.seq > after_seq)
        .order_by(audit.c.seq)
        .limit(limit)
    )
    return [dict(r._mapping) for r in rows]


async def unsealed_count(conn: AsyncConnection) -> int:
    return int((await conn.execute(select(func.count()).where(audit.c.seq.is_(None)))).scalar_one())
