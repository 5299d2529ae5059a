"""SQL for the audit log: append is a plain insert; sealing chains entries in batches."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core import audit_chain
from service.db.driver import Conn
from service.db.engine import AUDIT_KEY
from service.db.schema import audit
from service.db.statements import sql


async def append(conn: Conn, entries: Sequence[dict[str, Any]]) -> None:
    """Insert entries (caller, action, target, tenant, request_id, detail) unsealed.

    Each is signed with this transaction's audit key when it has one: the sealer chains only
    signed entries (a database writer without the key cannot sign). One statement, in order.
    """
    if not entries:
        return
    key = conn.info.get(AUDIT_KEY)
    rows = [
        {
            "caller": e["caller"],
            "action": e["action"],
            "target": e["target"],
            "tenant": e.get("tenant"),
            "request_id": e.get("request_id", ""),
            "detail": e.get("detail", {}),
        }
        for e in entries
    ]
    await conn.execute(
        _APPEND,
        {
            "callers": [r["caller"] for r in rows],
            "actions": [r["action"] for r in rows],
            "targets": [r["target"] for r in rows],
            "tenants": [r["tenant"] for r in rows],
            "request_ids": [r["request_id"] for r in rows],
            "details": [json.dumps(r["detail"]) for r in rows],
            "macs": [audit_chain.sign_row(key, r) if key is not None else None for r in rows],
        },
    )


_APPEND = sql(
    """
    INSERT INTO audit (caller, action, target, tenant, request_id, detail, mac)
    SELECT * FROM unnest(CAST(:callers AS text[]), CAST(:actions AS text[]),
                         CAST(:targets AS text[]), CAST(:tenants AS text[]),
                         CAST(:request_ids AS text[]), CAST(:details AS jsonb[]),
                         CAST(:macs AS bytea[]))
    """
)


async def recent(
    conn: AsyncConnection,
    *,
    tenants: frozenset[str] | None,
    limit: int,
    match: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The newest entries of `tenants`; `match`: column -> value (caller, action, tenant)."""
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
    for column, value in (match or {}).items():
        if column in FILTERS and value:
            q = q.where(audit.c[column] == value)
    return [dict(r._mapping) for r in await conn.execute(q)]


FILTERS = ("caller", "action", "tenant", "target")


SEAL_LOCK_KEY = 0x6265727400000002  # serialises sealers if two leaders briefly overlap


async def anchor(conn: Conn) -> tuple[int, bytes] | None:
    """(keyed_from, mac) when the keyed chain has begun; None before its first keyed seal."""
    row = (await conn.execute(_ANCHOR)).one_or_none()
    return (row.keyed_from, row.mac) if row else None


_ANCHOR = sql("SELECT keyed_from, mac FROM audit_anchor LIMIT 1")


@dataclass(frozen=True, slots=True)
class Sealed:
    count: int  # entries chained by this batch
    seq: int  # the head after it
    digest: bytes
    foreign: list[int]  # ids of entries with no valid signature: left out of the chain


class AnchorGone(Exception):
    """The keyed chain's anchor is missing after this server sealed keyed entries."""


async def seal_batch(
    conn: Conn, *, key: bytes, row_key: bytes, may_anchor: bool = True, limit: int = 2000
) -> Sealed:
    """Give the oldest unsealed entries their seq and keyed chained hash.

    Only entries a server signed on insert are chained; any other is marked (hash = b"") so it
    is named once and never chained, and `audit verify` names it. The anchor is written first
    when it is missing, in the same transaction, so the keyed part of the chain never begins
    without one.
    """
    await conn.execute(sql("SELECT pg_advisory_xact_lock(:k)"), {"k": SEAL_LOCK_KEY})
    seq, previous = await head(conn) or (0, audit_chain.GENESIS)
    if await anchor(conn) is None:
        if not may_anchor and seq:
            # It sealed keyed entries before, so the anchor was deleted behind its back: a new
            # one would pass a chain rewritten as plain SHA-256 off as "sealed before keys".
            raise AnchorGone(
                "the audit chain's keyed anchor is gone after this server sealed keyed entries: "
                "the chain was tampered with; sealing stops (run `berth audit verify`)"
            )
        # Written on the first pass of a keyed server, whether or not anything waits to be
        # sealed: from here on every entry is keyed, and `audit verify` refuses a chain with
        # sealed entries and no anchor (deleting it cannot pass the chain off as plain).
        await conn.execute(
            sql("INSERT INTO audit_anchor (id, keyed_from, mac) VALUES (1, :k, :m)"),
            {"k": seq + 1, "m": audit_chain.anchor_mac(key, seq + 1)},
        )
    rows = (await conn.execute(_UNSEALED, {"limit": limit})).all()
    ids, seqs, hashes, foreign = [], [], [], []
    for row in rows:
        entry = dict(row._mapping)
        if not audit_chain.row_signed(row_key, entry, entry["mac"]):
            foreign.append(row.id)
            continue
        seq += 1
        previous = audit_chain.link(previous, seq, entry, key)
        ids.append(row.id)
        seqs.append(seq)
        hashes.append(previous)
    if foreign:
        await conn.execute(
            sql("UPDATE audit SET hash = '' WHERE id = ANY(CAST(:ids AS bigint[]))"),
            {"ids": foreign},
        )
    if ids:
        await conn.execute(
            sql(
                """
                UPDATE audit SET seq = v.seq, hash = v.hash
                FROM unnest(CAST(:ids AS bigint[]), CAST(:seqs AS bigint[]),
                            CAST(:hashes AS bytea[])) AS v(id, seq, hash)
                WHERE audit.id = v.id
                """
            ),
            {"ids": ids, "seqs": seqs, "hashes": hashes},
        )
    return Sealed(len(ids), seq, previous, foreign)


async def unsealed(conn: AsyncConnection, *, after_id: int, limit: int) -> list[dict[str, Any]]:
    """Entries not in the chain (waiting, or marked as not signed), with their signature."""
    rows = await conn.execute(
        select(*(audit.c[f] for f in audit_chain.FIELDS), audit.c.mac, audit.c.hash)
        .where(audit.c.seq.is_(None), audit.c.id > after_id)
        .order_by(audit.c.id)
        .limit(limit)
    )
    return [dict(r._mapping) for r in rows]


async def head(conn: Conn) -> tuple[int, bytes] | None:
    """The newest sealed entry's (seq, hash)."""
    row = (await conn.execute(_HEAD)).one_or_none()
    return (row.seq, row.hash) if row else None


_HEAD = sql("SELECT seq, hash FROM audit WHERE seq IS NOT NULL ORDER BY seq DESC LIMIT 1")
_UNSEALED = sql(
    f"SELECT {', '.join(audit_chain.FIELDS)}, mac FROM audit "  # noqa: S608  (constant)
    "WHERE seq IS NULL AND hash IS NULL ORDER BY id LIMIT :limit FOR UPDATE"
)


async def sealed(conn: AsyncConnection, *, after_seq: int, limit: int) -> list[dict[str, Any]]:
    rows = await conn.execute(
        select(audit.c.seq, audit.c.hash, *(audit.c[f] for f in audit_chain.FIELDS))
        .where(audit.c.seq > after_seq)
        .order_by(audit.c.seq)
        .limit(limit)
    )
    return [dict(r._mapping) for r in rows]
