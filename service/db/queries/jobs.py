"""SQL for jobs.

Every read of job data takes `tenants` (None: all, for admins) and filters on it.
"""

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.states import LIVE_JOB_STATES, JobState
from service.db.driver import Conn
from service.db.queries import audit as audit_q
from service.db.records import JobRecord, OutputChunk
from service.db.schema import job_output, jobs, tenants
from service.db.statements import sql

COLS = [jobs.c[f] for f in JobRecord.__dataclass_fields__]
JOBS_CHANNEL = "berth_jobs_v1"


def _visible(tenant_set: frozenset[str] | None) -> ColumnElement[bool]:
    if tenant_set is None:
        return jobs.c.id.isnot(None)
    return jobs.c.tenant.in_(sorted(tenant_set))


async def ensure_tenants(conn: AsyncConnection, names: Sequence[str]) -> None:
    if names:
        await conn.execute(
            pg_insert(tenants).values([{"name": n} for n in set(names)]).on_conflict_do_nothing()
        )


# The tenants' bounds on queued jobs are checked in the statement that inserts: no round trip
# of its own and no lock. Concurrent submits each count what is committed, so together they may
# overshoot a bound by what they add at once (documented: the bound is not exact under races).
# A batch that would take any of its tenants past its bound inserts nothing (and audits and
# wakes nothing); the statement then returns one `over` row per such tenant instead of jobs.
_SUBMIT_SQL = (
    """
WITH r AS (
    SELECT * FROM jsonb_to_recordset(CAST(:jobs AS jsonb)) AS r(
        n int, tenant text, kind text, pool text, labels text[], device_policy text,
        command text[], python text, python_sha256 text, env jsonb, secrets jsonb,
        inputs jsonb, repo text, timeout_seconds float8, max_attempts int, priority int,
        cpus float8, memory_mb bigint, gpus int, created_by text)
), counted AS (
    -- One row per tenant of the batch (arrays, so the planner knows how few: a cheap plan).
    -- Counting stops past the bound (LIMIT): a tenant with a long queue costs no more than that.
    -- A tenant whose count the caller may skip (far below its bound; domain/queued.py) is not
    -- counted: a count walks every queued job of the tenant.
    SELECT v.tenant, v.adding, v.bound,
           CASE WHEN v.count THEN
               (SELECT count(*) FROM (SELECT 1 FROM jobs q
                                      WHERE q.tenant = v.tenant AND q.state = 'queued'
                                      ORDER BY q.priority DESC, q.id  -- ix_jobs_queued's order
                                      LIMIT v.bound + 1) AS x)
           END AS queued
    FROM unnest(CAST(:tenants AS text[]), CAST(:adding AS bigint[]),
                CAST(:bounds AS bigint[]), CAST(:count AS boolean[]))
         AS v(tenant, adding, bound, count)
), over AS (
    SELECT * FROM counted WHERE queued + adding > bound
), t AS (
    INSERT INTO tenants (name) SELECT DISTINCT tenant FROM r
    WHERE NOT EXISTS (SELECT 1 FROM over) ON CONFLICT DO NOTHING
), j AS (
    INSERT INTO jobs (tenant, kind, pool, labels, device_policy, command, python,
                      python_sha256, env, secrets, inputs, repo, timeout_seconds, max_attempts,
                      priority, cpus, memory_mb, gpus, created_by)
    SELECT tenant, kind, pool, labels, device_policy, command, python, python_sha256, env,
           secrets, inputs, repo, timeout_seconds, max_attempts, priority, cpus, memory_mb, gpus,
           created_by
    FROM r WHERE NOT EXISTS (SELECT 1 FROM over) ORDER BY n
    RETURNING {cols}
), wake AS (
    SELECT pg_notify('{channel}', '') WHERE NOT EXISTS (SELECT 1 FROM over)
)
SELECT j.*, NULL AS over_tenant, NULL AS over_adding, NULL AS over_bound, NULL AS over_queued
FROM j LEFT JOIN wake ON true
UNION ALL
SELECT {nulls}, tenant, adding, bound, queued FROM counted WHERE queued IS NOT NULL
ORDER BY id, over_tenant
""".replace("{cols}", ", ".join(c.name for c in COLS))
    .replace("{channel}", JOBS_CHANNEL)
    .replace("{nulls}", ", ".join(f"NULL AS {c.name}" for c in COLS))
)
_SUBMIT = sql(_SUBMIT_SQL)


@dataclass(frozen=True, slots=True)
class QueueCount:
    """A tenant's count against its bound on queued jobs (past it: the submit is refused)."""

    tenant: str
    adding: int  # jobs of the batch for it
    bound: int
    queued: int  # its queued jobs, counted up to bound + 1


async def submit_many(
    conn: Conn,
    rows: Sequence[dict[str, Any]],
    *,
    max_queued: Mapping[str, int],
    caller: str,
    request_id: str,
    on_behalf: str = "",
    uncounted: frozenset[str] = frozenset(),
) -> tuple[list[JobRecord], list[QueueCount], list[QueueCount]]:
    """Queue jobs, make their tenants, audit the submit and wake every server.

    The hot path of `POST /api/v1/jobs`: two round trips whatever the batch size (the audit
    entry is signed by this server once the ids are known, audit_q.append). When the batch
    would take a tenant's queued jobs past `max_queued[tenant]`, nothing is inserted and the
    tenants over their bounds are returned instead: (jobs created, tenants over, each counted
    tenant's queued jobs before the batch). The tenants in `uncounted` are not counted (the
    caller knows them to be far below their bounds).
    """
    payload = [{"n": i, **row} for i, row in enumerate(rows)]
    adding = Counter(row["tenant"] for row in rows)
    result = (
        await conn.execute(
            _SUBMIT,
            {
                "jobs": json.dumps(payload),
                "tenants": list(adding),
                "adding": list(adding.values()),
                "bounds": [max_queued[t] for t in adding],
                "count": [t not in uncounted for t in adding],
            },
        )
    ).all()
    counts = [
        QueueCount(r.over_tenant, int(r.over_adding), int(r.over_bound), int(r.over_queued))
        for r in result
        if r.over_tenant is not None
    ]
    over = [c for c in counts if c.queued + c.adding > c.bound]
    if over:
        return [], over, counts
    made = [JobRecord.of(r) for r in result if r.over_tenant is None]
    if made:
        first, last = made[0].id, made[-1].id
        tenants_of = {j.tenant for j in made}
        detail: dict[str, Any] = {"count": len(made)}
        if on_behalf:
            detail["on_behalf_of"] = on_behalf
        await audit_q.append(
            conn,
            [
                {
                    "caller": caller,
                    "action": "job.submitted",
                    "target": str(first) if first == last else f"{first}..{last}",
                    "tenant": next(iter(tenants_of)) if len(tenants_of) == 1 else None,
                    "request_id": request_id,
                    "detail": detail,
                }
            ],
        )
    return made, [], counts


async def notify_jobs(conn: Conn) -> None:
    """Tell every server that jobs may wait (delivered when the transaction commits)."""
    await conn.execute(sql(f"NOTIFY {JOBS_CHANNEL}"))


async def get(
    conn: AsyncConnection, job_id: int, *, tenants: frozenset[str] | None
) -> JobRecord | None:
    """The job if it exists and is in one of `tenants`; None otherwise (the same to the caller)."""
    row = (
        await conn.execute(select(*COLS).where(jobs.c.id == job_id, _visible(tenants)))
    ).one_or_none()
    return JobRecord.of(row) if row else None


async def list_visible(
    conn: AsyncConnection,
    *,
    tenants: frozenset[str] | None,
    state: str | None,
    tenant: str | None,
    limit: int,
    pool: str | None = None,
    worker: str | None = None,
    creator: str | None = None,
) -> list[JobRecord]:
    q = select(*COLS).where(_visible(tenants)).order_by(jobs.c.id.desc()).limit(limit)
    for column, wanted in (
        (jobs.c.state, state),
        (jobs.c.tenant, tenant),
        (jobs.c.pool, pool),
        (jobs.c.worker, worker),
        (jobs.c.created_by, creator),
    ):
        if wanted:
            q = q.where(column == wanted)
    return [JobRecord.of(r) for r in await conn.execute(q)]


async def cancel(conn: AsyncConnection, job_id: int) -> tuple[str, int] | None:
    """Cancel a job that is not finished; its live lease (if any) is cancelled with it.

    Returns (previous state, epoch), or None when the job had already ended.
    """
    row = (
        await conn.execute(
            sql(
                """
                WITH j AS (
                    SELECT id, state, attempt FROM jobs
                    WHERE id = :id AND state IN ('queued', 'leased', 'running') FOR UPDATE
                ), l AS (
                    UPDATE leases SET state = 'cancelled', ended_at = now()
                    FROM j WHERE leases.job_id = j.id AND leases.state = 'live'
                    RETURNING leases.job_id
                )
                UPDATE jobs SET state = 'cancelled', finished_at = now(),
                    error = 'cancelled'
                FROM j WHERE jobs.id = j.id
                RETURNING j.state AS before, j.attempt AS epoch
                """
            ),
            {"id": job_id},
        )
    ).one_or_none()
    return (row.before, row.epoch) if row else None


async def running_counts(conn: AsyncConnection) -> dict[str, int]:
    rows = await conn.execute(
        select(jobs.c.tenant, func.count())
        .where(jobs.c.state.in_([str(s) for s in LIVE_JOB_STATES]))
        .group_by(jobs.c.tenant)
    )
    return {r[0]: r[1] for r in rows}


async def queue_depth(conn: AsyncConnection) -> list[tuple[str | None, str, int]]:
    """(pool, kind, queued jobs), for `berth status`."""
    rows = await conn.execute(
        select(jobs.c.pool, jobs.c.kind, func.count())
        .where(jobs.c.state == JobState.QUEUED)
        .group_by(jobs.c.pool, jobs.c.kind)
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def queued(conn: AsyncConnection, *, limit: int) -> list[JobRecord]:
    rows = await conn.execute(
        select(*COLS).where(jobs.c.state == JobState.QUEUED).order_by(jobs.c.id).limit(limit)
    )
    return [JobRecord.of(r) for r in rows]


async def output_after(
    conn: AsyncConnection, job_id: int, *, after: int, limit: int = 1000
) -> list[OutputChunk]:
    rows = await conn.execute(
        select(job_output.c.id, job_output.c.stream, job_output.c.data)
        .where(job_output.c.job_id == job_id, job_output.c.id > after)
        .order_by(job_output.c.id)
        .limit(limit)
    )
    return [OutputChunk.of(r) for r in rows]


async def states(conn: AsyncConnection, job_id: int) -> str | None:
    row = (await conn.execute(select(jobs.c.state).where(jobs.c.id == job_id))).one_or_none()
    return row[0] if row else None


async def tenants_of(conn: AsyncConnection, job_ids: Sequence[int]) -> dict[int, str]:
    rows = await conn.execute(
        select(jobs.c.id, jobs.c.tenant).where(jobs.c.id.in_(sorted(set(job_ids))))
    )
    return {r[0]: r[1] for r in rows}
