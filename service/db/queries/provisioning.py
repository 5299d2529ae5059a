"""SQL for provisioning: the installation id, demand per pool, provisioned rows, pool health.

A pool never runs more provisioned workers than its `max`: `record_intent` counts and inserts
under a per-pool transaction lock, so two leaders that overlap for a moment cannot both start.
"""

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.statements import sql

ALIVE = ("starting", "running", "draining")
INTENT_LOCK = 0x62657274  # with a hash of the pool name: one (two-key) lock per pool


async def installation(conn: AsyncConnection) -> str:
    return str((await conn.execute(sql("SELECT id::text FROM installation LIMIT 1"))).scalar_one())


async def queued_groups(conn: AsyncConnection) -> list[dict[str, Any]]:
    """Queued jobs grouped by what decides who may take them: pool, kind, labels, policy.

    One aggregate over the queue (its partial index), whatever its length.
    """
    rows = await conn.execute(
        sql(
            """
            SELECT pool, kind, labels, device_policy = 'prefer' AS prefer, count(*) AS n
            FROM jobs WHERE state = 'queued'
            GROUP BY pool, kind, labels, device_policy
            """
        )
    )
    return [dict(r._mapping) for r in rows]


async def attached_usage(conn: AsyncConnection, pools: Sequence[str]) -> list[dict[str, Any]]:
    """Workers of these pools that may take work now, with their live leases per kind."""
    rows = await conn.execute(
        sql(
            """
            SELECT w.name, w.pool, w.parallel,
                coalesce((SELECT jsonb_object_agg(kind, n) FROM (
                    SELECT kind, count(*) AS n FROM leases l
                    WHERE l.worker_id = w.id AND l.state = 'live' GROUP BY kind) c),
                    '{}'::jsonb) AS used
            FROM workers w
            WHERE w.pool = ANY(:pools) AND w.server_id IS NOT NULL AND w.liveness = 'ok'
              AND w.state = 'active'
            """
        ),
        {"pools": list(pools)},
    )
    return [dict(r._mapping) for r in rows]


async def alive(conn: AsyncConnection) -> list[dict[str, Any]]:
    """Provisioned workers not ended, with live leases, idle time and whether attached."""
    rows = await conn.execute(
        sql(
            """
            SELECT p.name, p.pool, p.provider, p.state, p.provider_id, p.detail,
                extract(epoch FROM now() - p.created_at)::float8 AS age,
                extract(epoch FROM now() - p.busy_at)::float8 AS idle_for,
                (w.server_id IS NOT NULL AND w.liveness = 'ok') AS attached,
                w.id::text AS worker_id,
                (SELECT count(*) FROM leases l WHERE l.worker_id = w.id AND l.state = 'live')
                    AS live
            FROM provisioned p LEFT JOIN workers w ON w.name = p.name
            WHERE p.state IN ('starting', 'running', 'draining')
            ORDER BY p.pool, p.created_at
            """
        )
    )
    return [dict(r._mapping) for r in rows]


async def is_alive(conn: AsyncConnection, name: str) -> bool:
    """Whether the provisioned worker `name` is starting, running or draining."""
    row = await conn.execute(
        sql(
            "SELECT EXISTS (SELECT 1 FROM provisioned WHERE name = :n "
            "AND state IN ('starting', 'running', 'draining'))"
        ),
        {"n": name},
    )
    return bool(row.scalar_one())


async def mark_busy(conn: AsyncConnection) -> None:
    """Provisioned workers holding a lease now are not idle: idle_seconds counts from here."""
    await conn.execute(
        sql(
            """
            UPDATE provisioned p SET busy_at = now()
            FROM workers w
            WHERE w.name = p.name AND p.state IN ('starting', 'running', 'draining')
              AND EXISTS (SELECT 1 FROM leases l WHERE l.worker_id = w.id AND l.state = 'live')
            """
        )
    )


async def record_intent(
    conn: AsyncConnection, *, name: str, pool: str, provider: str, most: int
) -> bool:
    """Write the intent to start `name` unless the pool already has `most` alive; False then."""
    await conn.execute(
        sql("SELECT pg_advisory_xact_lock(CAST(:k AS int), hashtext(:p))"),
        {"k": INTENT_LOCK, "p": pool},
    )
    count = (
        await conn.execute(
            sql(
                "SELECT count(*) FROM provisioned "
                "WHERE pool = :p AND state IN ('starting', 'running', 'draining')"
            ),
            {"p": pool},
        )
    ).scalar_one()
    if count >= most:
        return False
    await conn.execute(
        sql("INSERT INTO provisioned (name, pool, provider) VALUES (:n, :p, :prov)"),
        {"n": name, "p": pool, "prov": provider},
    )
    return True


async def set_state(
    conn: AsyncConnection,
    *,
    name: str,
    state: str,
    detail: str | None = None,
    provider_id: str | None = None,
    only_from: Sequence[str] = ALIVE,
) -> bool:
    """Move a provisioned worker to `state` (from one of `only_from`); False when it was not."""
    row = await conn.execute(
        sql(
            """
            UPDATE provisioned SET state = :s, updated_at = now(),
                detail = coalesce(:d, detail), provider_id = coalesce(:pid, provider_id)
            WHERE name = :n AND state = ANY(:from)
            RETURNING name
            """
        ),
        {"s": state, "d": detail, "pid": provider_id, "n": name, "from": list(only_from)},
    )
    return row.first() is not None


async def start_failed(conn: AsyncConnection, *, pool: str, reason: str, backoff: float) -> int:
    """One more failed start for `pool`; the next waits `backoff` seconds. Returns failures."""
    row = await conn.execute(
        sql(
            """
            INSERT INTO pool_health AS h (pool, failures, next_try_at, last_error, updated_at)
            VALUES (:p, 1, now() + make_interval(secs => :b), :e, now())
            ON CONFLICT (pool) DO UPDATE SET failures = h.failures + 1,
                next_try_at = now() + make_interval(secs => :b), last_error = :e,
                updated_at = now()
            RETURNING failures
            """
        ),
        {"p": pool, "b": backoff, "e": reason[:2000]},
    )
    return int(row.scalar_one())


async def started_fine(conn: AsyncConnection, *, pool: str) -> None:
    """A worker of `pool` attached: the failures before it are forgiven."""
    await conn.execute(
        sql(
            "UPDATE pool_health SET failures = 0, next_try_at = NULL, last_error = '', "
            "updated_at = now() WHERE pool = :p AND failures > 0"
        ),
        {"p": pool},
    )


async def health(conn: AsyncConnection) -> dict[str, dict[str, Any]]:
    """Per pool: failures in a row, the last error, and seconds until the next start.

    `retry_in` is 0 when a start may be tried now.
    """
    rows = await conn.execute(
        sql(
            """
            SELECT pool, failures, last_error,
                greatest(0, extract(epoch FROM coalesce(next_try_at, now()) - now()))::float8
                    AS retry_in
            FROM pool_health
            """
        )
    )
    return {r.pool: dict(r._mapping) for r in rows}


async def counts(conn: AsyncConnection) -> dict[str, dict[str, int]]:
    """Provisioned workers alive per pool and state, for `pool list` and `status`."""
    rows = await conn.execute(
        sql(
            "SELECT pool, state, count(*) FROM provisioned "
            "WHERE state IN ('starting', 'running', 'draining') GROUP BY pool, state"
        )
    )
    out: dict[str, dict[str, int]] = {}
    for pool, state, n in rows:
        out.setdefault(pool, {})[state] = n
    return out


async def ended_names(conn: AsyncConnection) -> set[str]:
    """Provisioned workers that ended: `worker list` no longer shows them."""
    rows = await conn.execute(
        sql("SELECT name FROM provisioned WHERE state IN ('stopped', 'failed')")
    )
    return {r[0] for r in rows}


async def starting_without_worker(conn: AsyncConnection) -> list[dict[str, Any]]:
    """Provisioned workers that have not attached yet (no workers row): `starting` in lists."""
    rows = await conn.execute(
        sql(
            """
            SELECT p.name, p.pool, extract(epoch FROM now() - p.created_at)::float8 AS age
            FROM provisioned p WHERE p.state = 'starting'
              AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.name = p.name)
            ORDER BY p.name
            """
        )
    )
    return [dict(r._mapping) for r in rows]
