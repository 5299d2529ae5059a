"""SQL for worker reports, batched: one statement per kind for everything a flush collected.

Every report is fenced: it counts only while (job, epoch, worker) is the live lease. A pair
missing from a result set is stale, and its worker is told to kill that copy.
"""

from collections.abc import Sequence

from service.db.driver import Conn
from service.db.queries import audit as audit_q
from service.db.queries.leases import REQUEUE_LOST
from service.db.statements import sql

Key = tuple[int, int]  # (job, epoch)


async def start_many(conn: Conn, items: Sequence[tuple[int, int, str]]) -> set[Key]:
    """Leased -> running for (job, epoch, worker) under their live leases; returns those taken."""
    if not items:
        return set()
    rows = await conn.execute(
        sql(
            """
            UPDATE jobs SET state = 'running', started_at = coalesce(jobs.started_at, now())
            FROM unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]), CAST(:workers AS uuid[]))
                AS v(job, epoch, worker)
            WHERE jobs.id = v.job AND jobs.attempt = v.epoch
              AND jobs.state IN ('leased', 'running')
              AND EXISTS (SELECT 1 FROM leases l WHERE l.job_id = v.job AND l.epoch = v.epoch
                          AND l.worker_id = v.worker AND l.state = 'live')
            RETURNING jobs.id, v.epoch
            """
        ),
        _columns(items, "jobs", "epochs", "workers"),
    )
    return {(r[0], r[1]) for r in rows}


async def output_many(
    conn: Conn, items: Sequence[tuple[int, int, str, int, str, bytes]]
) -> set[Key]:
    """Keep output (job, epoch, worker, seq, stream, data) in order, live leases only.

    A chunk already kept (a resend after a reconnect) is kept once: (job, epoch, seq) is unique.
    """
    if not items:
        return set()
    rows = await conn.execute(
        sql(
            """
            WITH v AS (
                SELECT * FROM unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]),
                                     CAST(:workers AS uuid[]), CAST(:seqs AS bigint[]),
                                     CAST(:streams AS text[]), CAST(:datas AS bytea[]))
                    WITH ORDINALITY AS v(job, epoch, worker, seq, stream, data, n)
            ), ok AS (
                SELECT v.* FROM v JOIN leases l ON l.job_id = v.job AND l.epoch = v.epoch
                    AND l.worker_id = v.worker AND l.state = 'live'
            ), ins AS (
                INSERT INTO job_output (job_id, epoch, seq, stream, data)
                SELECT job, epoch, seq, stream, data FROM ok ORDER BY n
                ON CONFLICT (job_id, epoch, seq) DO NOTHING
            )
            SELECT DISTINCT job, epoch FROM ok
            """
        ),
        _columns(items, "jobs", "epochs", "workers", "seqs", "streams", "datas"),
    )
    return {(r[0], r[1]) for r in rows}


async def give_back_many(conn: Conn, items: Sequence[tuple[int, int, str]]) -> set[Key]:
    """Leases (job, epoch, worker) whose copy the worker stopped itself: expire, re-queue now.

    Like silence's stage 2, but at once: the worker says the copy is dead. A job whose attempts
    are spent fails with "worker lost". Returns the pairs that were still live.
    """
    if not items:
        return set()
    rows = await conn.execute(
        sql(
            f"""
            WITH l AS (
                UPDATE leases SET state = 'expired', ended_at = now()
                FROM unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]),
                            CAST(:workers AS uuid[])) AS v(job, epoch, worker)
                WHERE leases.job_id = v.job AND leases.epoch = v.epoch
                  AND leases.worker_id = v.worker AND leases.state = 'live'
                RETURNING leases.job_id, leases.epoch
            ), j AS (
            {REQUEUE_LOST}
                RETURNING jobs.id
            )
            SELECT job_id, epoch FROM l
            """  # noqa: S608  (constant fragments only)
        ),
        _columns(items, "jobs", "epochs", "workers"),
    )
    return {(r[0], r[1]) for r in rows}


async def finish_many(
    conn: Conn,
    items: Sequence[tuple[int, int, str, str, str, int | None, str]],
) -> dict[Key, str]:
    """Close live leases with their results; audit each, signed by its worker.

    Items are (job, epoch, worker id, worker name, state, exit code, error); returns the pairs
    accepted, with their job's tenant.
    """
    if not items:
        return {}
    rows = await conn.execute(
        sql(
            """
            WITH v AS (
                SELECT * FROM unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]),
                                     CAST(:workers AS uuid[]), CAST(:names AS text[]),
                                     CAST(:states AS text[]), CAST(:codes AS int[]),
                                     CAST(:errors AS text[]))
                    AS v(job, epoch, worker, name, state, code, error)
            ), l AS (
                UPDATE leases SET state = 'done', ended_at = now()
                FROM v WHERE leases.job_id = v.job AND leases.epoch = v.epoch
                    AND leases.worker_id = v.worker AND leases.state = 'live'
                RETURNING leases.job_id, leases.epoch
            ), j AS (
                UPDATE jobs SET state = v.state, exit_code = v.code, error = v.error,
                    finished_at = now(), started_at = coalesce(jobs.started_at, now())
                FROM l JOIN v ON v.job = l.job_id AND v.epoch = l.epoch
                WHERE jobs.id = l.job_id AND jobs.attempt = l.epoch
                RETURNING jobs.id, jobs.tenant, v.epoch, v.name, v.state, v.code
            )
            SELECT id, epoch, tenant, name, state, code FROM j ORDER BY id
            """
        ),
        _columns(items, "jobs", "epochs", "workers", "names", "states", "codes", "errors"),
    )
    done = rows.all()
    await audit_q.append(
        conn,
        [
            {
                "caller": f"worker:{r.name}",
                "action": "job.finished",
                "target": str(r.id),
                "tenant": r.tenant,
                "detail": {"state": r.state, "exit_code": r.code, "epoch": r.epoch},
            }
            for r in done
        ],
    )
    return {(r.id, r.epoch): r.tenant for r in done}


async def already_finished(conn: Conn, items: Sequence[tuple[int, int, str]]) -> set[Key]:
    """Of (job, epoch, worker), those whose result was accepted before: a resend, to ack again."""
    if not items:
        return set()
    rows = await conn.execute(
        sql(
            """
            SELECT l.job_id, l.epoch FROM leases l
            JOIN unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]), CAST(:workers AS uuid[]))
                AS v(job, epoch, worker)
              ON l.job_id = v.job AND l.epoch = v.epoch AND l.worker_id = v.worker
            WHERE l.state = 'done'
            """
        ),
        _columns(items, "jobs", "epochs", "workers"),
    )
    return {(r[0], r[1]) for r in rows}


def _columns(items: Sequence[tuple[object, ...]], *names: str) -> dict[str, list[object]]:
    return {name: [item[i] for item in items] for i, name in enumerate(names)}


async def live_jobs(conn: Conn, items: Sequence[tuple[int, int, str]]) -> dict[Key, str]:
    """Of (job, epoch, worker), those that are the worker's live lease: their job's tenant."""
    if not items:
        return {}
    rows = await conn.execute(
        sql(
            """
            SELECT j.id, l.epoch, j.tenant FROM leases l
            JOIN unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]), CAST(:workers AS uuid[]))
                AS v(job, epoch, worker)
              ON l.job_id = v.job AND l.epoch = v.epoch AND l.worker_id = v.worker
            JOIN jobs j ON j.id = l.job_id
            WHERE l.state = 'live'
            """
        ),
        _columns(items, "jobs", "epochs", "workers"),
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def merge_metrics(conn: Conn, items: Sequence[tuple[int, str]]) -> None:
    """Merge emitted numbers (job, JSON object) into each job's metrics: newest per name.

    One item per job: an UPDATE ... FROM applies only one of several rows matching a job.
    """
    if items:
        await conn.execute(
            sql(
                """
                UPDATE jobs SET metrics = jobs.metrics || CAST(v.m AS jsonb)
                FROM unnest(CAST(:jobs AS bigint[]), CAST(:ms AS text[])) AS v(job, m)
                WHERE jobs.id = v.job
                """
            ),
            {"jobs": [i[0] for i in items], "ms": [i[1] for i in items]},
        )


async def set_outputs(conn: Conn, items: Sequence[tuple[int, str]]) -> None:
    """Record each finished job's outputs (job, JSON list)."""
    if items:
        await conn.execute(
            sql(
                """
                UPDATE jobs SET outputs = CAST(v.o AS jsonb)
                FROM unnest(CAST(:jobs AS bigint[]), CAST(:os AS text[])) AS v(job, o)
                WHERE jobs.id = v.job
                """
            ),
            {"jobs": [i[0] for i in items], "os": [i[1] for i in items]},
        )
