"""SQL for workers: attach, heartbeats (batched), silence, operator states."""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.resources import Resources
from service.db.driver import Conn
from service.db.records import WorkerRecord
from service.db.statements import sql

WORKERS_CHANNEL = "berth_workers_v1"

_COLUMNS = """
    SELECT id::text AS id, name, identity, pool, state, liveness, instance, server_id, labels,
           tenants,
           parallel,
           host, capacity, python, env_digest, version, attached_at, last_seen_at,
           extract(epoch FROM clock_timestamp() - last_seen_at)::float8 AS seen_seconds_ago
"""
_SELECT = _COLUMNS + " FROM workers "


@dataclass(frozen=True, slots=True)
class Holder:
    """Who has a worker name now: the row's identity, and whether it is live or holds leases."""

    id: str
    identity: str
    instance: str
    busy: bool  # attached-looking (not lost or gone), or holding a live lease


async def holder(conn: Conn, *, name: str) -> Holder | None:
    """The row named `name`, locked for this transaction; None when there is none."""
    row = (
        await conn.execute(
            sql(
                """
                SELECT id::text AS id, identity, instance,
                    liveness IN ('ok', 'unreachable') OR EXISTS (
                        SELECT 1 FROM leases l WHERE l.worker_id = workers.id AND l.state = 'live'
                    ) AS busy
                FROM workers WHERE name = :name FOR UPDATE
                """
            ),
            {"name": name},
        )
    ).one_or_none()
    return Holder(row.id, row.identity, row.instance, bool(row.busy)) if row else None


async def holds_leases(conn: AsyncConnection, *, name: str) -> bool:
    """A worker of this name holds a live lease now."""
    row = await conn.execute(
        sql(
            "SELECT 1 FROM workers w JOIN leases l ON l.worker_id = w.id "
            "WHERE w.name = :name AND l.state = 'live' LIMIT 1"
        ),
        {"name": name},
    )
    return row.first() is not None


async def remove(conn: Conn, *, worker_id: str) -> None:
    """Delete a worker row (its ended leases go with it); callers check it holds none live."""
    await conn.execute(sql("DELETE FROM workers WHERE id = :id"), {"id": worker_id})


async def attach(
    conn: Conn,
    *,
    name: str,
    identity: str,
    pool: str,
    instance: str,
    server_id: str,
    labels: Sequence[str],
    tenants: Sequence[str],
    parallel: int,
    host: dict[str, Any],
    python: str,
    env_digest: str,
    version: str,
    capacity: dict[str, Any] | None = None,
) -> WorkerRecord | None:
    """Insert or refresh the worker named `name` as `identity`'s.

    The caller has checked (holder(), in this transaction) that the name is free or this
    identity's. None when another transaction inserted the name first.
    """
    row = (
        await conn.execute(
            sql(
                """
                INSERT INTO workers AS w (id, name, identity, pool, instance, server_id, labels,
                    tenants, parallel, host, capacity, python, env_digest, version, liveness,
                    attached_at, last_seen_at)
                VALUES (:id, :name, :identity, :pool, :instance, :server, :labels, :tenants,
                    :parallel, CAST(:host AS jsonb), CAST(:capacity AS jsonb), :python,
                    :env_digest, :version, 'ok', clock_timestamp(), clock_timestamp())
                ON CONFLICT (name) DO UPDATE SET identity = EXCLUDED.identity,
                    pool = EXCLUDED.pool,
                    instance = EXCLUDED.instance, server_id = EXCLUDED.server_id,
                    labels = EXCLUDED.labels, tenants = EXCLUDED.tenants,
                    parallel = EXCLUDED.parallel, host = EXCLUDED.host,
                    capacity = EXCLUDED.capacity,
                    python = EXCLUDED.python, env_digest = EXCLUDED.env_digest,
                    version = EXCLUDED.version, liveness = 'ok',
                    attached_at = clock_timestamp(), last_seen_at = clock_timestamp()
                WHERE w.identity = EXCLUDED.identity OR w.identity = ''
                RETURNING w.id
                """
            ),
            {
                "id": str(uuid.uuid4()),
                "name": name,
                "identity": identity,
                "pool": pool,
                "instance": instance,
                "server": server_id,
                "labels": list(labels),
                "tenants": sorted(tenants),
                "parallel": parallel,
                "host": json.dumps(host),
                "capacity": json.dumps(capacity or {}),
                "python": python,
                "env_digest": env_digest,
                "version": version,
            },
        )
    ).one_or_none()
    if row is None:
        return None
    return await get(conn, name=name)


async def get(conn: Conn, *, name: str) -> WorkerRecord | None:
    row = (await conn.execute(sql(_SELECT + " WHERE name = :n"), {"n": name})).one_or_none()
    return WorkerRecord.of(row) if row else None


async def list_all(conn: Conn) -> list[WorkerRecord]:
    rows = await conn.execute(sql(_SELECT + " ORDER BY name"))
    return [WorkerRecord.of(r) for r in rows]


async def beat_many(
    conn: Conn, *, server_id: str, beats: Sequence[tuple[str, dict[str, Any]]]
) -> set[str]:
    """Record heartbeats (worker id, host sample) in one statement; returns ids written.

    A worker whose row names another server is not written: it re-attached elsewhere, and this
    connection is a stale one to be closed.
    """
    if not beats:
        return set()
    rows = await conn.execute(
        sql(
            """
            UPDATE workers SET last_seen_at = clock_timestamp(), host = CAST(v.host AS jsonb),
                liveness = 'ok'
            FROM unnest(CAST(:ids AS uuid[]), CAST(:hosts AS text[])) AS v(id, host)
            WHERE workers.id = v.id AND workers.server_id = :server
            RETURNING workers.id
            """
        ),
        {
            "server": server_id,
            "ids": [b[0] for b in beats],
            "hosts": [json.dumps(b[1]) for b in beats],
        },
    )
    return {str(r[0]) for r in rows}


async def detach(conn: AsyncConnection, *, worker_id: str, server_id: str, gone: bool) -> None:
    """This server no longer holds the worker's socket. `gone`: it left on purpose."""
    await conn.execute(
        sql(
            """
            UPDATE workers SET server_id = NULL,
                liveness = CASE WHEN :gone THEN 'gone' ELSE liveness END
            WHERE id = :id AND server_id = :server
            """
        ),
        {"id": worker_id, "server": server_id, "gone": gone},
    )


async def tenants_for_update(conn: AsyncConnection, *, name: str) -> list[str] | None:
    """The tenants the worker serves ([]: every one), its row locked; None: no such worker."""
    row = (
        await conn.execute(
            sql("SELECT tenants FROM workers WHERE name = :n FOR UPDATE"), {"n": name}
        )
    ).one_or_none()
    return list(row.tenants) if row else None


async def set_state(conn: AsyncConnection, *, name: str, state: str) -> WorkerRecord | None:
    row = (
        await conn.execute(
            sql("UPDATE workers SET state = :s WHERE name = :n RETURNING name"),
            {"s": state, "n": name},
        )
    ).one_or_none()
    return await get(conn, name=name) if row else None


async def mark_unreachable(conn: AsyncConnection, *, after: float) -> list[str]:
    """Stage 1: attached-looking workers silent for `after` seconds. Returns their names."""
    rows = await conn.execute(
        sql(
            """
            UPDATE workers SET liveness = 'unreachable'
            WHERE liveness = 'ok'
              AND last_seen_at < clock_timestamp() - make_interval(secs => :after)
            RETURNING name
            """
        ),
        {"after": after},
    )
    return [r[0] for r in rows]


async def mark_lost(conn: AsyncConnection, *, after: float) -> list[tuple[str, str]]:
    """Stage 2: silent for `after` seconds and still alive-looking or holding leases.

    Returns (id, name) of workers whose leases must now expire.
    """
    rows = await conn.execute(
        sql(
            """
            UPDATE workers SET liveness = CASE WHEN liveness = 'gone' THEN 'gone' ELSE 'lost' END
            WHERE last_seen_at < clock_timestamp() - make_interval(secs => :after)
              AND (liveness IN ('ok', 'unreachable')
                   OR EXISTS (SELECT 1 FROM leases
                              WHERE leases.worker_id = workers.id AND leases.state = 'live'))
            RETURNING id, name
            """
        ),
        {"after": after},
    )
    return [(str(r[0]), r[1]) for r in rows]


async def notify(conn: AsyncConnection, payload: dict[str, Any]) -> None:
    """Tell every server about a worker (cancel, drain, revoke); the holder of its socket acts."""
    await conn.execute(
        sql("SELECT pg_notify(:ch, :p)"), {"ch": WORKERS_CHANNEL, "p": json.dumps(payload)}
    )


async def placeable_if_queued(
    conn: Conn, ids: Sequence[str]
) -> list[tuple[WorkerRecord, dict[str, int], Resources]]:
    """These workers with their live leases per kind and what those reserve.

    Nothing at all when no job is queued. One round trip for what a dispatch pass needs first
    (and, when idle, all it needs).
    """
    rows = await conn.execute(
        sql(
            _COLUMNS  # noqa: S608  (constant column list, no input)
            + """,
                coalesce(u.used, '{}'::jsonb) AS used, coalesce(u.cpus, 0) AS r_cpus,
                coalesce(u.memory_mb, 0) AS r_memory_mb, coalesce(u.gpus, 0) AS r_gpus
            FROM workers LEFT JOIN LATERAL (
                SELECT jsonb_object_agg(kind, n) AS used, sum(cpus) AS cpus,
                       sum(memory_mb) AS memory_mb, sum(gpus) AS gpus
                FROM (SELECT kind, count(*) AS n, sum(cpus) AS cpus, sum(memory_mb) AS memory_mb,
                             sum(gpus) AS gpus
                      FROM leases l WHERE l.worker_id = workers.id AND l.state = 'live'
                      GROUP BY kind) c
            ) u ON true
            WHERE id = ANY(CAST(:ids AS uuid[]))
              AND EXISTS (SELECT 1 FROM jobs WHERE state = 'queued')
            """
        ),
        {"ids": list(ids)},
    )
    return [
        (
            WorkerRecord.of(r),
            dict(r.used),
            Resources(float(r.r_cpus), int(r.r_memory_mb), int(r.r_gpus)),
        )
        for r in rows
    ]


async def lock(conn: AsyncConnection, *, name: str) -> WorkerRecord | None:
    """The worker `name`, locked until the transaction ends.

    No lease is granted to it meanwhile: a grant's lease row must share-lock its worker's row.
    """
    row = (
        await conn.execute(sql(_SELECT + " WHERE name = :n FOR UPDATE"), {"n": name})
    ).one_or_none()
    return WorkerRecord.of(row) if row else None


async def delete(conn: AsyncConnection, *, worker_id: str) -> None:
    """Remove a worker that holds no live lease, with its ended leases.

    Those are its history of runs; the jobs keep the worker's name.
    """
    await conn.execute(
        sql(
            """
            WITH old AS (DELETE FROM leases WHERE worker_id = :id AND state <> 'live')
            DELETE FROM workers WHERE id = :id
            """
        ),
        {"id": worker_id},
    )


async def forget(conn: AsyncConnection, *, after: float) -> list[str]:
    """Delete workers lost or gone for `after` seconds that hold no lease; returns their names.

    Rows someone holds (a worker attaching again under its name) are skipped, not waited for.
    """
    rows = await conn.execute(
        sql(
            """
            WITH doomed AS (
                SELECT id, name FROM workers w
                WHERE liveness IN ('lost', 'gone')
                  AND last_seen_at < clock_timestamp() - make_interval(secs => :after)
                  AND NOT EXISTS (SELECT 1 FROM leases l
                                  WHERE l.worker_id = w.id AND l.state = 'live')
                FOR UPDATE SKIP LOCKED
            ), old AS (
                DELETE FROM leases WHERE worker_id IN (SELECT id FROM doomed)
            )
            DELETE FROM workers WHERE id IN (SELECT id FROM doomed)
            RETURNING name
            """
        ),
        {"after": after},
    )
    return sorted(r[0] for r in rows)
