"""SQL for leases: claiming queued jobs, fenced reports, expiry.

Invariant (migration 0001): at most one live lease per job, enforced by the partial unique index
`leases_one_live_per_job`. Every report is accepted only while (job, epoch, worker) is the live
lease; a False/None result means stale, and the worker must kill its copy.
"""

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.placement import JobWant, Quotas
from service.core.resources import Resources
from service.db.driver import Conn
from service.db.records import JobRecord
from service.db.statements import sql

_JOB_COLS = ", ".join(f"jobs.{f}" for f in JobRecord.__dataclass_fields__)
# The column list is a constant built from the record's fields, never from input.
_GRANT_SQL = """
WITH a AS (
    SELECT * FROM unnest(CAST(:jobs AS bigint[]), CAST(:workers AS uuid[]),
                         CAST(:names AS text[])) AS a(job_id, worker_id, name)
), j AS (
    UPDATE jobs SET state = 'leased', attempt = jobs.attempt + 1, worker = a.name
    FROM a WHERE jobs.id = a.job_id AND jobs.state = 'queued'
    RETURNING {job_cols}, a.worker_id
), l AS (
    INSERT INTO leases (job_id, epoch, worker_id, kind, cpus, memory_mb, gpus)
    SELECT id, attempt, worker_id, kind, cpus, memory_mb, gpus FROM j
)
SELECT * FROM j
""".replace("{job_cols}", _JOB_COLS)


async def live_counts(
    conn: AsyncConnection, worker_ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Live leases per worker per kind."""
    rows = await conn.execute(
        sql(
            "SELECT worker_id, kind, count(*) FROM leases "
            "WHERE state = 'live' AND worker_id = ANY(CAST(:ids AS uuid[])) "
            "GROUP BY worker_id, kind"
        ),
        {"ids": list(worker_ids)},
    )
    out: dict[str, dict[str, int]] = {}
    for worker_id, kind, n in rows:
        out.setdefault(str(worker_id), {})[kind] = n
    return out


# Queued jobs in fairness order (see `candidates`). With no quota in force {quota} and
# {gpus_held} are "" (the plan of before quotas existed: running jobs are counted from the index
# alone), else a filter that leaves out what a tenant's quota holds back, and the GPUs it holds.
_CANDIDATES_SQL = """
WITH t AS (
    SELECT DISTINCT tenant FROM jobs WHERE state = 'queued'
      AND (CAST(:tenants AS text[]) IS NULL OR tenant = ANY(CAST(:tenants AS text[])))
), running AS (
    SELECT tenant, count(*) AS n{gpus_held} FROM jobs
    WHERE state IN ('leased', 'running') GROUP BY tenant
), c AS (
    SELECT q.*, row_number() OVER (PARTITION BY q.tenant ORDER BY q.priority DESC, q.id)
        AS rn
    FROM t CROSS JOIN LATERAL (
        SELECT id, tenant, kind, pool, labels, device_policy, priority, cpus, memory_mb, gpus
        FROM jobs
        WHERE jobs.tenant = t.tenant AND jobs.state = 'queued'
          AND jobs.kind = ANY(:kinds)
          AND (jobs.pool IS NULL OR jobs.pool = ANY(:pools))
        ORDER BY priority DESC, id LIMIT :per_tenant
    ) q
)
SELECT c.* FROM c LEFT JOIN running r USING (tenant)
{quota}
ORDER BY coalesce(r.n, 0) + c.rn, c.priority DESC, c.id
LIMIT :limit
"""
# A tenant's k-th candidate runs only if k more jobs stay within its max_running; a GPU job only
# if its GPUs fit what the tenant holds (the claim checks the sum again, under a lock).
_QUOTA_FILTER = """
LEFT JOIN unnest(CAST(:q_tenants AS text[]), CAST(:q_running AS int[]), CAST(:q_gpus AS int[]))
    AS q(tenant, max_running, max_gpus) USING (tenant)
WHERE (coalesce(q.max_running, :d_running) = 0
       OR coalesce(r.n, 0) + c.rn <= coalesce(q.max_running, :d_running))
  AND (coalesce(q.max_gpus, :d_gpus) = 0 OR c.gpus = 0
       OR coalesce(r.g, 0) + c.gpus <= coalesce(q.max_gpus, :d_gpus))
"""


async def candidates(
    conn: Conn,
    *,
    kinds: Sequence[str],
    pools: Sequence[str],
    per_tenant: int,
    limit: int,
    tenants: Sequence[str] | None = None,
    quotas: Quotas | None = None,
) -> list[JobWant]:
    """Queued jobs in fairness order: fewest running per tenant, then priority, then age.

    The k-th queued job of a tenant ranks as if its tenant already ran k-1 more jobs, so one
    pass hands slots out round-robin over tenants, weighted by what each already runs.
    `tenants`: only these (every free worker is a tenant's own machine); None: every tenant.
    `quotas`: leave out the jobs a tenant's max_running / max_gpus holds back (as counted now;
    `hold_quotas` decides under a lock).
    """
    params: dict[str, object] = {
        "kinds": list(kinds),
        "pools": list(pools),
        "per_tenant": per_tenant,
        "limit": limit,
        "tenants": None if tenants is None else list(tenants),
    }
    query = _CANDIDATES_SQL.replace("{quota}", "").replace("{gpus_held}", "")
    if quotas:
        query = _CANDIDATES_SQL.replace("{quota}", _QUOTA_FILTER).replace(
            "{gpus_held}", ", sum(gpus) AS g"
        )
        names = sorted(quotas.tenants)
        params |= {
            "q_tenants": names,
            "q_running": [quotas.tenants[n].max_running for n in names],
            "q_gpus": [quotas.tenants[n].max_gpus for n in names],
            "d_running": quotas.default.max_running,
            "d_gpus": quotas.default.max_gpus,
        }
    rows = await conn.execute(sql(query), params)
    return [JobWant.of(r) for r in rows]


async def hold_quotas(conn: Conn, tenants: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Lock these tenants' quotas until commit; then (jobs running, GPUs held) of each.

    Two servers granting to one tenant at once take turns here (a transaction-scoped advisory
    lock per tenant, taken in name order so two passes never deadlock), and the second counts
    after the first committed: together they never pass its max_running or max_gpus. The
    count is a statement of its own, so that its snapshot is taken once the lock is held.
    """
    names = sorted(set(tenants))
    await conn.execute(
        sql(
            "SELECT pg_advisory_xact_lock(hashtextextended('berth.quota.' || t, 0)) "
            "FROM unnest(CAST(:t AS text[])) AS t ORDER BY t"
        ),
        {"t": names},
    )
    return await usage_of_tenants(conn, names)


async def usage_of_tenants(conn: Conn, tenants: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(jobs running, GPUs held) of each of these tenants now, without a lock (for people)."""
    rows = await conn.execute(
        sql(
            "SELECT tenant, count(*), coalesce(sum(gpus), 0) FROM jobs "
            "WHERE state IN ('leased', 'running') AND tenant = ANY(CAST(:t AS text[])) "
            "GROUP BY tenant"
        ),
        {"t": sorted(set(tenants))},
    )
    found = {r[0]: (int(r[1]), int(r[2])) for r in rows}
    return {t: found.get(t, (0, 0)) for t in tenants}


async def reserved(conn: AsyncConnection, worker_ids: Sequence[str]) -> dict[str, Resources]:
    """What the live leases of each of these workers asked for (workers with none: absent)."""
    rows = await conn.execute(
        sql(
            "SELECT worker_id, sum(cpus), sum(memory_mb), sum(gpus) FROM leases "
            "WHERE state = 'live' AND worker_id = ANY(CAST(:ids AS uuid[])) GROUP BY worker_id"
        ),
        {"ids": list(worker_ids)},
    )
    return {str(r[0]): Resources(float(r[1]), int(r[2]), int(r[3])) for r in rows}


async def lock_queued(conn: Conn, job_ids: Sequence[int], *, want: int) -> set[int]:
    """Lock up to `want` of these, first in the order given, that are still queued.

    Rows another server is granting right now are skipped, so servers racing over the same
    candidates each take the next free ones instead of all but one coming away empty.
    """
    rows = await conn.execute(
        sql(
            """
            SELECT id FROM jobs
            WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'queued'
            ORDER BY array_position(CAST(:ids AS bigint[]), id)
            LIMIT :want
            FOR UPDATE SKIP LOCKED
            """
        ),
        {"ids": list(job_ids), "want": want},
    )
    return {r[0] for r in rows}


async def grant(conn: Conn, assignments: Sequence[tuple[int, str, str]]) -> list[JobRecord]:
    """Lease each (job_id, worker_id, worker_name) in one statement; the epoch is attempt + 1.

    The jobs must be locked by `lock_queued` in this transaction.
    """
    if not assignments:
        return []
    rows = await conn.execute(
        sql(_GRANT_SQL),
        {
            "jobs": [a[0] for a in assignments],
            "workers": [a[1] for a in assignments],
            "names": [a[2] for a in assignments],
        },
    )
    return [JobRecord.of(r) for r in rows]


async def live_of(conn: Conn, worker_id: str) -> list[tuple[int, int]]:
    rows = await conn.execute(
        sql("SELECT job_id, epoch FROM leases WHERE worker_id = :w AND state = 'live'"),
        {"w": worker_id},
    )
    return [(r[0], r[1]) for r in rows]


async def live_of_job(conn: AsyncConnection, job_id: int) -> tuple[int, str, str] | None:
    """The job's live lease: (epoch, worker id, the worker's pool), or None."""
    row = (
        await conn.execute(
            sql(
                "SELECT l.epoch, CAST(l.worker_id AS text), w.pool FROM leases l "
                "JOIN workers w ON w.id = l.worker_id WHERE l.job_id = :j AND l.state = 'live'"
            ),
            {"j": job_id},
        )
    ).first()
    return (row[0], row[1], row[2]) if row is not None else None


# The jobs of the leases in `l` (job_id, epoch) that just expired: queued again, or failed
# "worker lost" once their attempts are spent. Fenced by epoch: a job that moved on is left.
REQUEUE_LOST = """
UPDATE jobs SET
    state = CASE WHEN jobs.attempt >= jobs.max_attempts THEN 'failed' ELSE 'queued' END,
    error = CASE WHEN jobs.attempt >= jobs.max_attempts THEN 'worker lost' ELSE jobs.error END,
    finished_at = CASE WHEN jobs.attempt >= jobs.max_attempts THEN now() END,
    worker = CASE WHEN jobs.attempt >= jobs.max_attempts THEN jobs.worker END
FROM l WHERE jobs.id = l.job_id AND jobs.attempt = l.epoch
  AND jobs.state IN ('leased', 'running')
"""


async def expire(
    conn: Conn,
    *,
    worker_ids: Sequence[str],
    only: Sequence[tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Expire live leases of these workers (all, or `only` those (job, epoch)); re-queue jobs.

    A job whose attempts are spent fails with "worker lost". Fenced by epoch: a job that has
    moved on is left alone. Returns the jobs touched, with their new state.
    """
    only_jobs = [j for j, _ in only] if only is not None else None
    only_epochs = [e for _, e in only] if only is not None else None
    rows = await conn.execute(
        sql(
            f"""
            WITH l AS (
                UPDATE leases SET state = 'expired', ended_at = now()
                WHERE state = 'live' AND worker_id = ANY(CAST(:workers AS uuid[]))
                  AND (CAST(:jobs AS bigint[]) IS NULL OR (job_id, epoch) IN (
                        SELECT * FROM unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[]))))
                RETURNING job_id, epoch
            )
            {REQUEUE_LOST}
            RETURNING jobs.id, jobs.state, l.epoch
            """  # noqa: S608  (constant fragments only)
        ),
        {"workers": list(worker_ids), "jobs": only_jobs, "epochs": only_epochs},
    )
    return [dict(r._mapping) for r in rows]


async def live_among(
    conn: Conn,
    *,
    worker_id: str,
    held: Sequence[tuple[int, int]],
    tenants: Sequence[str] | None = None,
) -> set[tuple[int, int]]:
    """Which of the (job, epoch) pairs a worker says it holds are its live leases.

    `tenants`: only leases of those tenants' jobs count (a worker bound to tenants); None: any.
    """
    if not held:
        return set()
    rows = await conn.execute(
        sql(
            """
            SELECT l.job_id, l.epoch FROM leases l JOIN jobs j ON j.id = l.job_id
            WHERE l.worker_id = :w AND l.state = 'live' AND (l.job_id, l.epoch) IN (
                SELECT * FROM unnest(CAST(:jobs AS bigint[]), CAST(:epochs AS int[])))
              AND (CAST(:tenants AS text[]) IS NULL OR j.tenant = ANY(CAST(:tenants AS text[])))
            """
        ),
        {
            "w": worker_id,
            "jobs": [h[0] for h in held],
            "epochs": [h[1] for h in held],
            "tenants": None if tenants is None else list(tenants),
        },
    )
    return {(r[0], r[1]) for r in rows}


async def of_job(conn: AsyncConnection, job_id: int) -> list[dict[str, Any]]:
    """A job's attempts, oldest first: epoch, worker name, lease state, granted and ended."""
    rows = await conn.execute(
        sql(
            "SELECT l.epoch, w.name AS worker, l.state, l.granted_at, l.ended_at "
            "FROM leases l JOIN workers w ON w.id = l.worker_id "
            "WHERE l.job_id = :j ORDER BY l.epoch"
        ),
        {"j": job_id},
    )
    return [dict(r._mapping) for r in rows]
