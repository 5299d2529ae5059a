"""SQL for berth's bearer tokens. Only hashes are stored."""

from collections.abc import Sequence

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.driver import Conn
from service.db.records import TokenRecord
from service.db.schema import tokens
from service.db.statements import sql

_COLS = [tokens.c[f] for f in TokenRecord.__dataclass_fields__]


async def create(
    conn: AsyncConnection,
    *,
    name: str,
    kind: str,
    digest: bytes,
    tenants: list[str],
    created_by: str,
    expires_days: float,
    pool: str | None = None,
    labels: list[str] | None = None,
) -> TokenRecord:
    """Insert a token; raises Conflict (translated) when a live token already has the name."""
    row = (
        await conn.execute(
            insert(tokens)
            .values(
                name=name,
                kind=kind,
                hash=digest,
                tenants=tenants,
                created_by=created_by,
                pool=pool,
                labels=labels,
                expires_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, expires_days * 86400),
            )
            .returning(*_COLS)
        )
    ).one()
    return TokenRecord.of(row)


async def by_digest(conn: Conn, digest: bytes) -> tuple[TokenRecord, bool] | None:
    """The token with this hash and whether it is usable now (not revoked, not expired)."""
    # A credential being rotated: the next one is valid from the moment it is sent.
    row = (await conn.execute(_BY_DIGEST, {"d": digest})).one_or_none()
    if row is None:
        return None
    return TokenRecord.of(row), bool(row.fresh) and row.revoked_at is None


_TEXT_COLS = ", ".join(c.name for c in _COLS)
_BY_DIGEST = sql(
    f"SELECT {_TEXT_COLS}, expires_at > now() AS fresh FROM tokens "  # noqa: S608  (constant)
    "WHERE hash = :d OR next_hash = :d"
)


async def list_all(conn: AsyncConnection) -> list[TokenRecord]:
    rows = await conn.execute(select(*_COLS).order_by(tokens.c.id))
    return [TokenRecord.of(r) for r in rows]


async def revoke(conn: AsyncConnection, *, name: str) -> TokenRecord | None:
    """Revoke the live token called `name`; None when there is none."""
    row = (
        await conn.execute(
            update(tokens)
            .where(tokens.c.name == name, tokens.c.revoked_at.is_(None))
            .values(revoked_at=func.now())
            .returning(*_COLS)
        )
    ).one_or_none()
    return TokenRecord.of(row) if row else None


async def live_by_name(conn: Conn, *, name: str) -> TokenRecord | None:
    """The live (unrevoked) token called `name`, or None."""
    row = (await conn.execute(_LIVE_BY_NAME, {"n": name})).one_or_none()
    return TokenRecord.of(row) if row else None


_LIVE_BY_NAME = sql(
    f"SELECT {_TEXT_COLS} FROM tokens "  # noqa: S608  (constant)
    "WHERE name = :n AND revoked_at IS NULL"
)


async def lock_live_admins(conn: AsyncConnection) -> list[str]:
    """Names of the usable admin tokens, row-locked until the transaction ends.

    Two revokes racing for the last two admin tokens serialise here (always in id order, so
    they cannot deadlock): the second one, once the first commits, re-reads the rows and sees a
    single live admin left.
    """
    rows = await conn.execute(
        select(tokens.c.name)
        .where(
            tokens.c.kind == "admin",
            tokens.c.revoked_at.is_(None),
            tokens.c.expires_at > func.now(),
        )
        .order_by(tokens.c.id)
        .with_for_update()
    )
    return [r[0] for r in rows]


async def any_admin(conn: AsyncConnection) -> bool:
    row = await conn.execute(select(tokens.c.id).where(tokens.c.kind == "admin").limit(1))
    return row.first() is not None


async def begin_rotation(conn: AsyncConnection, *, name: str, digest: bytes) -> bool:
    """Make `digest` the live token's next credential (both valid); False when it is gone."""
    row = await conn.execute(
        update(tokens)
        .where(tokens.c.name == name, tokens.c.revoked_at.is_(None))
        .values(next_hash=digest)
        .returning(tokens.c.id)
    )
    return row.first() is not None


async def finish_rotation(conn: AsyncConnection, *, name: str) -> bool:
    """The worker stored its next credential: it replaces the old one, which stops working."""
    row = await conn.execute(
        update(tokens)
        .where(tokens.c.name == name, tokens.c.revoked_at.is_(None), tokens.c.next_hash.isnot(None))
        .values(hash=tokens.c.next_hash, next_hash=None, rotated_at=func.now())
        .returning(tokens.c.id)
    )
    return row.first() is not None


async def rotation_due(conn: Conn, *, name: str, hours: float) -> float | None:
    """Seconds until the live bound credential `name` is due to rotate (<= 0: now).

    None when it is not one that rotates (not bound by a join token, or gone).
    """
    row = (await conn.execute(_ROTATION_DUE, {"n": name, "s": hours * 3600})).one_or_none()
    return float(row[0]) if row else None


_ROTATION_DUE = sql(
    """
    SELECT extract(epoch FROM coalesce(rotated_at, created_at)
                   + make_interval(secs => CAST(:s AS float8)) - now())
    FROM tokens WHERE name = :n AND revoked_at IS NULL AND pool IS NOT NULL
    """
)


async def dead_credentials(conn: AsyncConnection, names: Sequence[str]) -> dict[str, str]:
    """Of these names, those whose every token is revoked or expired: name -> which.

    A name with no token at all (a worker behind a proxy) is not in the answer.
    """
    if not names:
        return {}
    rows = await conn.execute(
        sql(
            """
            SELECT name,
                   CASE WHEN bool_or(revoked_at IS NULL) THEN 'expired' ELSE 'revoked' END
            FROM tokens WHERE name = ANY(CAST(:names AS text[]))
            GROUP BY name
            HAVING NOT bool_or(revoked_at IS NULL AND expires_at > now())
            """
        ),
        {"names": list(names)},
    )
    return {r[0]: r[1] for r in rows}
