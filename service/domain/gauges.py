"""The installation in numbers, as /metrics exports it: read from Postgres in one transaction."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.db.engine import Database
from service.db.queries import gauges as gauges_q


@dataclass(frozen=True, slots=True)
class Snapshot:
    queued: Mapping[tuple[str, ...], int] = field(default_factory=dict)  # (pool, kind) -> jobs
    jobs: Mapping[tuple[str, ...], int] = field(default_factory=dict)  # (state,) -> jobs
    workers: Mapping[tuple[str, ...], int] = field(default_factory=dict)  # (pool, state)
    provisioned: Mapping[tuple[str, ...], int] = field(default_factory=dict)  # (pool, state)
    provider_failures: Mapping[tuple[str, ...], int] = field(default_factory=dict)  # (pool,)
    store_bytes: int = 0


async def snapshot(db: Database) -> Snapshot:
    """Six aggregate queries; queue depths come from the database, so all servers agree."""
    async with db.begin() as conn:
        return Snapshot(
            queued=await gauges_q.counts(conn, gauges_q.QUEUED),
            jobs=await gauges_q.counts(conn, gauges_q.JOBS_BY_STATE),
            workers=await gauges_q.counts(conn, gauges_q.WORKERS),
            provisioned=await gauges_q.counts(conn, gauges_q.PROVISIONED),
            provider_failures=await gauges_q.counts(conn, gauges_q.FAILURES),
            store_bytes=await gauges_q.store_bytes(conn),
        )
