"""One dispatch pass: give the free slots of this server's workers to queued jobs.

Runs on every server for the workers attached to it (their websockets are here), so a job
reaches a worker without going through a leader. Safe under concurrency: candidates are locked
with SKIP LOCKED, and `leases_one_live_per_job` rejects any second live lease outright.
"""

from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from service.core import placement
from service.core.placement import PoolSpec
from service.core.states import DevicePolicy, Liveness
from service.db.engine import Database
from service.db.queries import leases as leases_q
from service.db.queries import workers as workers_q
from service.db.records import JobRecord
from service.domain.fleet import view_of

# Candidates locked per free slot, plus a few: room for label and pool mismatches without
# reading (and building records for) four rows per slot on a busy pass.
OVERFETCH = 1.5
EXTRA = 16


async def run_pass(
    db: Database, worker_ids: Sequence[str], pools: Mapping[str, PoolSpec]
) -> list[tuple[str, JobRecord]]:
    """Lease queued jobs to free slots of `worker_ids`; returns (worker id, job) grants."""
    if not worker_ids:
        return []
    async with db.begin() as conn:
        if not await leases_q.any_queued(conn):  # the common idle case: one indexed probe
            return []
        records = await workers_q.by_ids(conn, worker_ids)
        used = await leases_q.live_counts(conn, worker_ids)
        views = [view_of(w, used.get(w.id, {}), attached=True) for w in records]
        free_kinds: set[str] = set()
        total = 0
        open_pools: set[str] = set()
        for v in views:
            pool = pools.get(v.pool)
            if pool is None or placement.blocked_by(v, pool) is not None:
                continue
            free = placement.free_slots(v, pool)
            n = sum(free.values())
            if v.parallel > 0:
                n = min(n, max(0, v.parallel - sum(v.used.values())))
            if n > 0:
                total += n
                open_pools.add(v.pool)
                free_kinds |= {k for k, c in free.items() if c > 0}
        if total == 0:
            return []
        wants = await leases_q.candidates(
            conn,
            kinds=sorted(free_kinds),
            pools=sorted(open_pools),
            per_tenant=int(total * OVERFETCH) + EXTRA,
            limit=int(total * OVERFETCH) + EXTRA,
        )
        if not wants:
            return []
        locked = await leases_q.lock_queued(conn, [w.id for w in wants])
        wants = [w for w in wants if w.id in locked]
        attached = views
        if any(w.device_policy is DevicePolicy.PREFER and w.labels for w in wants):
            attached = await _attached_everywhere(conn)
        chosen = placement.assign(wants, views, pools, attached=attached)
        granted = await leases_q.grant(conn, [(j.id, w.id, w.name) for j, w in chosen])
    by_job = {j.id: w.id for j, w in chosen}
    return [(by_job[job.id], job) for job in granted]


async def _attached_everywhere(conn: AsyncConnection) -> list[placement.WorkerView]:
    records = await workers_q.list_all(conn)
    return [
        view_of(w, {}, attached=w.server_id is not None and w.liveness == Liveness.OK)
        for w in records
    ]
