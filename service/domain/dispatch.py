"""One dispatch pass: give the free slots of this server's workers to queued jobs.

Runs on every server for the workers attached to it (their websockets are here), so a job
reaches a worker without going through a leader. Safe under concurrency: candidates are locked
with SKIP LOCKED, and `leases_one_live_per_job` rejects any second live lease outright.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from service.core import placement
from service.core.placement import PoolSpec, Quotas
from service.core.states import DevicePolicy, Liveness
from service.db.driver import Conn
from service.db.engine import Database
from service.db.queries import leases as leases_q
from service.db.queries import workers as workers_q
from service.db.records import JobRecord
from service.domain.fleet import view_of

# Candidates locked per free slot, plus a few: room for label and pool mismatches without
# reading (and building records for) four rows per slot on a busy pass.
OVERFETCH = 1.5
EXTRA = 16


@dataclass(frozen=True, slots=True)
class Pass:
    grants: list[tuple[str, JobRecord]] = field(default_factory=list)  # (worker id, job)
    contended: bool = False  # another server held some of our picks: pass again soon


async def run_pass(
    db: Database,
    worker_ids: Sequence[str],
    pools: Mapping[str, PoolSpec],
    quotas: Quotas | None = None,
) -> Pass:
    """Lease queued jobs to free slots of `worker_ids`, within each tenant's `quotas`."""
    if not worker_ids:
        return Pass()
    async with db.driver() as conn:
        # Idle (nothing queued) ends here, after one round trip.
        found = await workers_q.placeable_if_queued(conn, worker_ids)
        if not found:
            return Pass()
        views = [view_of(w, used, attached=True, reserved=r) for w, used, r in found]
        free_kinds: set[str] = set()
        total = 0
        open_pools: set[str] = set()
        served: set[str] | None = set()  # None once a fleet-wide worker has room
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
                served = None if served is None or not v.tenants else served | v.tenants
        if total == 0:
            return Pass()
        wants = await leases_q.candidates(
            conn,
            kinds=sorted(free_kinds),
            pools=sorted(open_pools),
            per_tenant=int(total * OVERFETCH) + EXTRA,
            limit=int(total * OVERFETCH) + EXTRA,
            tenants=None if served is None else sorted(served),
            quotas=quotas,
        )
        if not wants:
            return Pass()
        attached = views
        if any(w.device_policy is DevicePolicy.PREFER and w.labels for w in wants):
            attached = await _attached_everywhere(conn)
        # Place first, then lock what was placed (others after it, in order, as stand-ins for
        # any that another server holds right now), then place again over what we hold.
        tentative = placement.assign(wants, views, pools, attached=attached)
        if not tentative:
            return Pass()
        first = [j.id for j, _ in tentative]
        order = first + [w.id for w in wants if w.id not in set(first)]
        locked = await leases_q.lock_queued(conn, order, want=len(tentative))
        chosen = placement.assign(
            [w for w in wants if w.id in locked], views, pools, attached=attached
        )
        if quotas:
            chosen = await _within_quotas(conn, chosen, quotas)
        granted = await leases_q.grant(conn, [(j.id, w.id, w.name) for j, w in chosen])
    by_job = {j.id: w.id for j, w in chosen}
    return Pass(
        grants=[(by_job[job.id], job) for job in granted],
        contended=len(chosen) < len(tentative),
    )


async def _within_quotas(
    conn: Conn,
    chosen: list[tuple[placement.JobWant, placement.WorkerView]],
    quotas: Quotas,
) -> list[tuple[placement.JobWant, placement.WorkerView]]:
    """The assignments that keep each tenant within its quota, counted under its lock.

    Only tenants with a quota are locked and counted: the claim of the others costs nothing
    more. What is left out stays queued for a later pass.
    """
    capped = sorted({j.tenant for j, _ in chosen if quotas.of(j.tenant)})
    if not capped:
        return chosen
    usage = await leases_q.hold_quotas(conn, capped)
    kept = []
    for job, worker in chosen:
        quota = quotas.of(job.tenant)
        if quota:
            running, gpus = usage[job.tenant]
            if placement.over_quota(
                job.request, job.tenant, running=running, gpus=gpus, quota=quota
            ):
                continue
            usage[job.tenant] = (running + 1, gpus + job.request.gpus)
        kept.append((job, worker))
    return kept


async def _attached_everywhere(conn: Conn) -> list[placement.WorkerView]:
    records = await workers_q.list_all(conn)
    return [
        view_of(w, {}, attached=w.server_id is not None and w.liveness == Liveness.OK)
        for w in records
    ]
