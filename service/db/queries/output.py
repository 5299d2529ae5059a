"""SQL for a job's output: the newest in job_output rows, older in store segments.

Rows and segments never overlap: a segment is inserted and the rows it holds are deleted in one
transaction, and both keep the rows' ids, so output reads back in one order whatever moved.
"""

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.statements import sql


async def over_tail(conn: AsyncConnection, *, tail: int, limit: int) -> list[int]:
    """Jobs holding more than `tail` bytes of output in rows."""
    rows = await conn.execute(
        sql(
            "SELECT job_id FROM job_output GROUP BY job_id HAVING sum(length(data)) > :tail "
            "ORDER BY job_id LIMIT :limit"
        ),
        {"tail": tail, "limit": limit},
    )
    return [r[0] for r in rows]


async def oldest_beyond_tail(
    conn: AsyncConnection, job_id: int, *, tail: int, most: int
) -> list[dict[str, Any]]:
    """The job's oldest rows, up to `most` bytes, that are not among its newest `tail` bytes."""
    rows = await conn.execute(
        sql(
            """
            WITH r AS (
                SELECT id, epoch, seq, stream, data,
                       sum(length(data)) OVER (ORDER BY id DESC) AS newer_and_me,
                       sum(length(data)) OVER (ORDER BY id) AS older_and_me
                FROM job_output WHERE job_id = :job
            )
            SELECT id, epoch, seq, stream, data FROM r
            WHERE newer_and_me > :tail AND older_and_me - length(data) < :most
            ORDER BY id
            """
        ),
        {"job": job_id, "tail": tail, "most": most},
    )
    return [dict(r._mapping) for r in rows]


async def add_segment(
    conn: AsyncConnection, *, job_id: int, first_id: int, last_id: int, sha256: str, size: int
) -> None:
    """Record a segment and delete the rows it holds (the caller's transaction: both or none)."""
    await conn.execute(
        sql(
            "INSERT INTO job_log_segments (job_id, first_id, last_id, sha256, size) "
            "VALUES (:job, :first, :last, :sha, :size)"
        ),
        {"job": job_id, "first": first_id, "last": last_id, "sha": sha256, "size": size},
    )
    await conn.execute(
        sql("DELETE FROM job_output WHERE job_id = :job AND id BETWEEN :first AND :last"),
        {"job": job_id, "first": first_id, "last": last_id},
    )


async def segments_after(conn: AsyncConnection, job_id: int, *, after: int) -> list[dict[str, Any]]:
    """The job's segments holding rows after `after`, oldest first."""
    rows = await conn.execute(
        sql(
            "SELECT first_id, last_id, sha256, size FROM job_log_segments "
            "WHERE job_id = :job AND last_id > :after ORDER BY first_id"
        ),
        {"job": job_id, "after": after},
    )
    return [dict(r._mapping) for r in rows]


PACK_LOCK = 1650815605  # with the job id: one packer per job at a time


async def lock_and_count(conn: AsyncConnection, job_id: int, *, first: int, last: int) -> int:
    """Take the job's packer lock until the transaction ends.

    Returns how many of its rows with ids in [first, last] are still there.
    """
    await conn.execute(
        sql("SELECT pg_advisory_xact_lock(CAST(:k AS int), :j)"), {"k": PACK_LOCK, "j": job_id}
    )
    row = await conn.execute(
        sql("SELECT count(*) FROM job_output WHERE job_id = :j AND id BETWEEN :f AND :l"),
        {"j": job_id, "f": first, "l": last},
    )
    return int(row.scalar_one())
