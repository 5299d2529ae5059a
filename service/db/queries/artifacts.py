"""SQL for artifact references (`cas_refs`). Functions take the connection and never commit.

When a reference stops holding its blob (`_EXPIRES`, NULL: it holds it still):
- a write in progress (size -1) holds it for `PENDING` at most (a crashed upload lets go);
- a job's reference while its job has not finished, then `gc` seconds after `jobs.finished_at`
  (derived here, so no job path has to end references itself; `ended_at` stays NULL);
- one without a job (an upload, a collector's note) `gc` seconds after `ended_at`; a row whose
  job row was deleted (job_id set NULL, never ended) counts from its `created_at`.
A tenant reads through a reference that holds its blob and is complete (size >= 0).

Locking against the collector: every insert first takes the shared form of a per-blob
transaction advisory lock (`lock_shared`); the collector takes the exclusive form (`lock`),
re-checks the references and deletes the blob while it holds it. So a reference is either
committed before the collector looks (and the blob is kept), or made after the deletion (and
its writer writes the blob anew): never both missed.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.driver import Conn
from service.db.statements import sql


@dataclass(frozen=True, slots=True)
class Ref:
    """A complete reference to insert: `tenant` may read blob `sha256` through it."""

    tenant: str
    sha256: str
    size: int
    what: str
    job_id: int | None
    by: str


CAS_LOCK = 0x63617321  # 'cas!': with hashtext(sha256), one two-key advisory lock per blob
PENDING = "interval '1 day'"

_GC = "make_interval(secs => CAST(:gc AS double precision))"
_EXPIRES = f"""
CASE WHEN r.size < 0 THEN r.created_at + {PENDING}
     WHEN r.job_id IS NOT NULL THEN j.finished_at + {_GC}
     ELSE coalesce(r.ended_at, r.created_at) + {_GC}
END
"""
# A reference that still holds its blob. The fragment is a constant, never built from input.
_HOLDS = f"(({_EXPIRES}) IS NULL OR ({_EXPIRES}) > now())"
_FROM = "cas_refs r LEFT JOIN jobs j ON j.id = r.job_id"


async def lock_shared(conn: Conn, *shas: str) -> None:
    """Take these blobs' locks in shared form until the transaction ends.

    Every reference insert does; one statement for any number of blobs.
    """
    await conn.execute(
        sql(
            "SELECT pg_advisory_xact_lock_shared(CAST(:k AS int), hashtext(s)) "
            "FROM (SELECT DISTINCT s FROM unnest(CAST(:shas AS text[])) AS s ORDER BY s) AS o"
        ),
        {"k": CAS_LOCK, "shas": list(shas)},
    )


async def lock(conn: Conn, sha256: str) -> None:
    """Take the blob's lock exclusively until the transaction ends (the collector)."""
    await conn.execute(
        sql("SELECT pg_advisory_xact_lock(CAST(:k AS int), hashtext(:sha))"),
        {"k": CAS_LOCK, "sha": sha256},
    )


async def insert(
    conn: Conn,
    *,
    tenant: str,
    sha256: str,
    size: int,
    what: str,
    job_id: int | None,
    by: str,
) -> int:
    """A reference (size -1: a write in progress); ended now when it has no job. Its id."""
    await lock_shared(conn, sha256)
    row = await conn.execute(
        sql(
            "INSERT INTO cas_refs (tenant, sha256, size, what, job_id, created_by, ended_at) "
            "VALUES (:tenant, :sha, CAST(:size AS bigint), :what, CAST(:job AS bigint), :by, "
            "        CASE WHEN CAST(:job AS bigint) IS NULL AND CAST(:size AS bigint) >= 0 "
            "        THEN now() END) "
            "RETURNING id"
        ),
        {"tenant": tenant, "sha": sha256, "size": size, "what": what, "job": job_id, "by": by},
    )
    return int(row.scalar_one())


async def complete(conn: Conn, *, ref_id: int, size: int) -> bool:
    """The write behind a pending reference is done: record the size; end it if it has no job.

    False when the row is gone (the collector let a pending write of over a day go).
    """
    row = await conn.execute(
        sql(
            "UPDATE cas_refs SET size = :size, "
            "    ended_at = CASE WHEN job_id IS NULL THEN now() ELSE ended_at END "
            "WHERE id = :id RETURNING id"
        ),
        {"id": ref_id, "size": size},
    )
    return row.first() is not None


async def drop(conn: Conn, *, ref_id: int) -> None:
    """Remove a reference whose write failed: it must grant nothing."""
    await conn.execute(sql("DELETE FROM cas_refs WHERE id = :id"), {"id": ref_id})


async def held_size(conn: Conn, *, tenants: Sequence[str], sha256: str, gc: float) -> int | None:
    """The blob's size when one of `tenants` holds a complete reference to it; None otherwise."""
    row = await conn.execute(
        sql(
            f"SELECT max(r.size) FROM {_FROM} "  # noqa: S608  (constant fragments only)
            f"WHERE r.tenant = ANY(CAST(:tenants AS text[])) AND r.sha256 = :sha "
            f"  AND r.size >= 0 AND {_HOLDS}"
        ),
        {"tenants": list(tenants), "sha": sha256, "gc": gc},
    )
    size = row.scalar_one()
    return None if size is None else int(size)


async def stored_bytes(conn: Conn, *, tenant: str, gc: float) -> int:
    """Bytes of the distinct blobs `tenant`'s complete references keep in the store now."""
    row = await conn.execute(
        sql(
            f"SELECT coalesce(sum(s.size), 0) FROM ("  # noqa: S608  (constant fragments only)
            f"  SELECT max(r.size) AS size FROM {_FROM} "
            f"  WHERE r.tenant = :tenant AND r.size >= 0 AND {_HOLDS} GROUP BY r.sha256) AS s"
        ),
        {"tenant": tenant, "gc": gc},
    )
    return int(row.scalar_one())


async def insert_many(conn: Conn, refs: Sequence[Ref]) -> None:
    """Complete references, one statement for all (and one for their blobs' locks)."""
    if not refs:
        return
    await lock_shared(conn, *(r.sha256 for r in refs))
    await conn.execute(
        sql(
            "INSERT INTO cas_refs (tenant, sha256, size, what, job_id, created_by, ended_at) "
            "SELECT tenant, sha, size, what, job, by, CASE WHEN job IS NULL THEN now() END "
            "FROM unnest(CAST(:tenants AS text[]), CAST(:shas AS text[]), "
            "            CAST(:sizes AS bigint[]), CAST(:whats AS text[]), "
            "            CAST(:jobs AS bigint[]), CAST(:bys AS text[])) "
            "    AS v(tenant, sha, size, what, job, by)"
        ),
        {
            "tenants": [r.tenant for r in refs],
            "shas": [r.sha256 for r in refs],
            "sizes": [r.size for r in refs],
            "whats": [r.what for r in refs],
            "jobs": [r.job_id for r in refs],
            "bys": [r.by for r in refs],
        },
    )


async def held_sizes(conn: Conn, *, tenant: str, shas: Sequence[str], gc: float) -> dict[str, int]:
    """Of `shas`, those `tenant` holds a complete reference to: their sizes."""
    rows = await conn.execute(
        sql(
            f"SELECT r.sha256, max(r.size) FROM {_FROM} "  # noqa: S608  (constant fragments)
            f"WHERE r.tenant = :tenant AND r.sha256 = ANY(CAST(:shas AS text[])) "
            f"  AND r.size >= 0 AND {_HOLDS} GROUP BY r.sha256"
        ),
        {"tenant": tenant, "shas": list(set(shas)), "gc": gc},
    )
    return {r[0]: int(r[1]) for r in rows}


async def drop_outputs_except(conn: Conn, listed: Sequence[tuple[int, Sequence[str]]]) -> None:
    """Delete each job's `output` references except to the blobs listed for it; one statement."""
    if not listed:
        return
    await conn.execute(
        sql(
            "DELETE FROM cas_refs r "
            "USING unnest(CAST(:jobs AS bigint[]), CAST(:keep AS text[])) AS v(job, keep) "
            "WHERE r.job_id = v.job AND r.what = 'output' "
            "  AND NOT r.sha256 = ANY(string_to_array(v.keep, ','))"
        ),
        {"jobs": [job for job, _ in listed], "keep": [",".join(shas) for _, shas in listed]},
    )


async def written_for_jobs(conn: Conn, pairs: Sequence[tuple[int, str]]) -> set[tuple[int, str]]:
    """Of (job, sha256), those with a complete reference of that job (a fenced write)."""
    if not pairs:
        return set()
    rows = await conn.execute(
        sql(
            "SELECT DISTINCT r.job_id, r.sha256 FROM cas_refs r "
            "JOIN unnest(CAST(:jobs AS bigint[]), CAST(:shas AS text[])) AS v(job, sha) "
            "  ON r.job_id = v.job AND r.sha256 = v.sha "
            "WHERE r.size >= 0"
        ),
        {"jobs": [p[0] for p in pairs], "shas": [p[1] for p in pairs]},
    )
    return {(r[0], r[1]) for r in rows}


async def live_lease_tenant(conn: Conn, *, job_id: int, epoch: int, worker: str) -> str | None:
    """The job's tenant while (job, epoch) is the live lease of the worker named `worker`.

    None means stale (or never this worker's): refuse, as a report would be refused.
    """
    row = await conn.execute(
        sql(
            "SELECT j.tenant FROM leases l JOIN workers w ON w.id = l.worker_id "
            "JOIN jobs j ON j.id = l.job_id "
            "WHERE l.job_id = :job AND l.epoch = :epoch AND l.state = 'live' AND w.name = :worker"
        ),
        {"job": job_id, "epoch": epoch, "worker": worker},
    )
    tenant = row.scalar_one_or_none()
    return None if tenant is None else str(tenant)


# -- the collector ---------------------------------------------------------------------------


async def unheld(conn: Conn, *, gc: float, limit: int) -> list[str]:
    """Blobs that have references, none of which holds them any more (candidates to delete)."""
    rows = await conn.execute(
        sql(
            f"SELECT r.sha256 FROM {_FROM} "  # noqa: S608  (constant fragments only)
            f"GROUP BY r.sha256 HAVING NOT bool_or({_HOLDS}) LIMIT :limit"
        ),
        {"gc": gc, "limit": limit},
    )
    return [str(r[0]) for r in rows]


async def holds(conn: Conn, *, sha256: str, gc: float) -> bool:
    """Whether any reference (complete or pending, of any tenant) still holds the blob."""
    row = await conn.execute(
        sql(
            f"SELECT EXISTS (SELECT 1 FROM {_FROM} "  # noqa: S608  (constant fragments only)
            f"WHERE r.sha256 = :sha AND {_HOLDS})"
        ),
        {"sha": sha256, "gc": gc},
    )
    return bool(row.scalar_one())


async def forget(conn: AsyncConnection, *, sha256: str) -> int:
    """Delete every reference to a blob the collector deleted; how many there were."""
    row = await conn.execute(
        sql("DELETE FROM cas_refs WHERE sha256 = :sha"),
        {"sha": sha256},
    )
    return int(row.rowcount)


async def known(conn: Conn, *, shas: Sequence[str]) -> set[str]:
    """Which of these blobs any reference row names (held or not)."""
    rows = await conn.execute(
        sql("SELECT DISTINCT sha256 FROM cas_refs WHERE sha256 = ANY(CAST(:shas AS text[]))"),
        {"shas": list(shas)},
    )
    return {str(r[0]) for r in rows}


async def note_unclaimed(conn: Conn, *, blobs: Sequence[tuple[str, int]]) -> None:
    """Note blobs in the store that no reference names: each is held `gc` from now, then goes.

    A worker may write a blob before it reports the output that references it; the note gives
    it [cas] gc_days to do so. Tenant "" is nobody's: the note grants no read.
    """
    if not blobs:
        return
    await conn.execute(
        sql(
            "INSERT INTO cas_refs (tenant, sha256, size, what, created_by, ended_at) "
            "SELECT '', v.sha, v.size, 'unclaimed', 'collector', now() "
            "FROM unnest(CAST(:shas AS text[]), CAST(:sizes AS bigint[])) AS v(sha, size)"
        ),
        {"shas": [b[0] for b in blobs], "sizes": [b[1] for b in blobs]},
    )


async def delete_long_expired(conn: AsyncConnection, *, gc: float) -> int:
    """Delete references that stopped holding their blob over `gc` seconds ago; how many.

    Only where another reference still holds the blob: the rows of a blob nothing holds go
    with the blob (`forget`), else the blob would look unreferenced and be noted afresh.
    """
    row = await conn.execute(
        sql(
            f"WITH held AS (SELECT DISTINCT r.sha256 FROM {_FROM} WHERE {_HOLDS}) "  # noqa: S608
            f"DELETE FROM cas_refs WHERE id IN ("
            f"  SELECT r.id FROM {_FROM} "
            f"  WHERE ({_EXPIRES}) + {_GC} < now()"
            f"    AND r.sha256 IN (SELECT sha256 FROM held))"
        ),
        {"gc": gc},
    )
    return int(row.rowcount)
