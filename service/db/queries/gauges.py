"""SQL for the gauges /metrics reads at scrape time: a few aggregates, whatever the table sizes."""

from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.statements import sql


async def counts(conn: AsyncConnection, query: str) -> dict[tuple[str, ...], int]:
    """Rows of (labels..., count) as {labels: count}."""
    rows = await conn.execute(sql(query))
    return {tuple(str(v) for v in r[:-1]): int(r[-1]) for r in rows}


JOBS_BY_STATE = "SELECT state, count(*) FROM jobs GROUP BY state"
QUEUED = (
    "SELECT coalesce(pool, '*'), kind, count(*) FROM jobs WHERE state = 'queued' "
    "GROUP BY pool, kind"
)
# Attached workers by the operator's word; workers no server holds are `offline`.
WORKERS = (
    "SELECT pool, CASE WHEN server_id IS NULL THEN 'offline' ELSE state END AS shown, count(*) "
    "FROM workers GROUP BY pool, shown"
)
PROVISIONED = (
    "SELECT pool, state, count(*) FROM provisioned "
    "WHERE state IN ('starting', 'running', 'draining') GROUP BY pool, state"
)
FAILURES = "SELECT pool, failures FROM pool_health"


async def store_bytes(conn: AsyncConnection) -> int:
    """Bytes of the distinct blobs that references hold (a blob held twice counts once)."""
    got = await conn.execute(
        sql(
            "SELECT coalesce(sum(size), 0) FROM "
            "(SELECT DISTINCT ON (sha256) size FROM cas_refs WHERE size >= 0) AS b"
        )
    )
    return int(got.scalar_one())
