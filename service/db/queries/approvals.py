"""SQL for approvals: ask, read (tenant-filtered), answer, and settle the overdue and orphaned.

Every read takes `tenants` (None: all, for admins) and filters on it. An answer and a settle
are single UPDATEs guarded by `state = 'pending'`: of two racing, one changes the row and the
other finds it answered, so each request is answered (and audited) once.
"""

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Interval, and_, func, literal, select, true, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.records import ApprovalRecord
from service.db.schema import approvals, leases
from service.db.statements import sql

COLS = [approvals.c[f] for f in ApprovalRecord.__dataclass_fields__]
CLOSED_REASON = "the job's lease ended before an answer"
TIMED_OUT_REASON = "no answer before the deadline: denied"


def _visible(tenants: frozenset[str] | None) -> ColumnElement[bool]:
    return true() if tenants is None else approvals.c.tenant.in_(sorted(tenants))


async def live_lease(conn: AsyncConnection, job_id: int) -> tuple[int, str] | None:
    """(epoch, pool of the worker holding it) of the job's live lease; None without one."""
    row = (
        await conn.execute(
            sql(
                "SELECT l.epoch, w.pool FROM leases l JOIN workers w ON w.id = l.worker_id "
                "WHERE l.job_id = :j AND l.state = 'live'"
            ),
            {"j": job_id},
        )
    ).first()
    return None if row is None else (int(row[0]), str(row[1]))


async def root_creator(conn: AsyncConnection, job_id: int) -> str:
    """Who created the job, through the jobs that submitted it: the first creator not a job.

    A job that a job submitted is created by `job:<id>`; four-eyes must refuse the person
    behind that chain, not only its last link. A chain whose start is gone ends at a `job:`.
    """
    row = (
        await conn.execute(
            sql(
                """
                WITH RECURSIVE chain(created_by, depth) AS (
                    SELECT created_by, 0 FROM jobs WHERE id = :j
                    UNION ALL
                    SELECT p.created_by, c.depth + 1 FROM chain c
                    JOIN jobs p ON c.created_by LIKE 'job:%'
                               AND p.id = CAST(substr(c.created_by, 5) AS bigint)
                    WHERE c.depth < 100
                )
                SELECT created_by FROM chain ORDER BY depth DESC LIMIT 1
                """
            ),
            {"j": job_id},
        )
    ).first()
    return "" if row is None else str(row[0])


async def insert(conn: AsyncConnection, row: dict[str, Any], *, timeout: float) -> ApprovalRecord:
    """A pending request whose deadline is `timeout` seconds from now (the database's clock)."""
    deadline = func.now() + literal(timedelta(seconds=timeout), Interval())
    result = await conn.execute(
        pg_insert(approvals).values(**row, deadline=deadline).returning(*COLS)
    )
    return ApprovalRecord.of(result.one())


async def get(
    conn: AsyncConnection, approval_id: int, *, tenants: frozenset[str] | None
) -> ApprovalRecord | None:
    row = (
        await conn.execute(select(*COLS).where(approvals.c.id == approval_id, _visible(tenants)))
    ).first()
    return None if row is None else ApprovalRecord.of(row)


async def list_visible(
    conn: AsyncConnection,
    *,
    tenants: frozenset[str] | None,
    state: str | None,
    job_id: int | None,
    limit: int,
) -> list[ApprovalRecord]:
    """Newest first."""
    q = select(*COLS).where(_visible(tenants))
    if state is not None:
        q = q.where(approvals.c.state == state)
    if job_id is not None:
        q = q.where(approvals.c.job_id == job_id)
    rows = await conn.execute(q.order_by(approvals.c.id.desc()).limit(limit))
    return [ApprovalRecord.of(r) for r in rows]


async def pending_of_job(conn: AsyncConnection, job_id: int) -> ApprovalRecord | None:
    """The job's oldest open request (what it waits for first)."""
    row = (
        await conn.execute(
            select(*COLS)
            .where(approvals.c.job_id == job_id, approvals.c.state == "pending")
            .order_by(approvals.c.id)
            .limit(1)
        )
    ).first()
    return None if row is None else ApprovalRecord.of(row)


async def answer(
    conn: AsyncConnection, approval_id: int, *, state: str, by: str, reason: str
) -> ApprovalRecord | None:
    """Answer a request still pending and within its deadline; None when it is not."""
    row = (
        await conn.execute(
            update(approvals)
            .where(
                approvals.c.id == approval_id,
                approvals.c.state == "pending",
                approvals.c.deadline > func.now(),
            )
            .values(state=state, answered_by=by, answered_at=func.now(), reason=reason)
            .returning(*COLS)
        )
    ).first()
    return None if row is None else ApprovalRecord.of(row)


async def settle(
    conn: AsyncConnection, ids: Sequence[int] | None = None
) -> tuple[list[ApprovalRecord], list[ApprovalRecord]]:
    """Pending requests past their deadline -> timed_out; those whose lease ended -> closed.

    `ids`: only these (the claim of one answer: it waits for a row another holds); None: all of
    them, skipping rows another transaction holds (it settles or answers them), so passes and
    listings running at once never wait on each other nor deadlock.
    Returns (timed out, closed), each changed here and now, so each is audited once.
    """
    lease_live = (
        select(leases.c.id)
        .where(
            leases.c.job_id == approvals.c.job_id,
            leases.c.epoch == approvals.c.epoch,
            leases.c.state == "live",
        )
        .exists()
    )

    def which(*cond: ColumnElement[bool]) -> ColumnElement[bool]:
        pending = approvals.c.state == "pending"
        if ids is not None:
            return and_(pending, approvals.c.id.in_(list(ids)), *cond)
        free = (
            select(approvals.c.id)
            .where(pending, *cond)
            .with_for_update(skip_locked=True, of=approvals)
        )
        return and_(pending, approvals.c.id.in_(free.scalar_subquery()))

    closed = await conn.execute(
        update(approvals)
        .where(which(~lease_live))
        .values(state="closed", answered_at=func.now(), reason=CLOSED_REASON)
        .returning(*COLS)
    )
    closed_rows = [ApprovalRecord.of(r) for r in closed]
    timed_out = await conn.execute(
        update(approvals)
        .where(which(approvals.c.deadline <= func.now()))
        .values(state="timed_out", answered_at=func.now(), reason=TIMED_OUT_REASON)
        .returning(*COLS)
    )
    return [ApprovalRecord.of(r) for r in timed_out], closed_rows
