"""The fleet as people see it: workers with why they get no lease, pools, status; drain and co.

Tenants see the fleet through their own tenants (SPEC section 8): a caller bound to tenants is
shown the fleet-wide workers and those serving one of its tenants, with no tenant named but its
own, and changes the state only of workers that serve its tenants alone. A fleet-wide caller (an
admin, or an operator bound to no tenant) sees and changes all of it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.auth.callers import Caller
from service.core import placement, resources
from service.core.errors import Conflict, Forbidden, Invalid, NotFound
from service.core.placement import HostSample, PoolSpec, WorkerView
from service.core.resources import NOTHING, Resources
from service.core.states import Liveness, WorkerState, shown_worker_state
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import leases as leases_q
from service.db.queries import provisioning as prov_q
from service.db.queries import tokens as tokens_q
from service.db.queries import workers as workers_q
from service.db.records import WorkerRecord
from service.domain import audit
from service.domain.limits import InForce


def host_of(raw: Mapping[str, Any]) -> HostSample | None:
    if not raw:
        return None
    return HostSample(
        cpus=int(raw.get("cpus", 0)),
        load=float(raw.get("load", 0.0)),
        free_memory_gb=float(raw.get("free_memory_gb", 0.0)),
        free_disk_gb=float(raw.get("free_disk_gb", 0.0)),
        gpus=tuple(raw.get("gpus", ())),
    )


def view_of(
    w: WorkerRecord,
    used: Mapping[str, int],
    *,
    attached: bool | None = None,
    reserved: Resources = NOTHING,
) -> WorkerView:
    return WorkerView(
        id=w.id,
        name=w.name,
        pool=w.pool,
        state=WorkerState(w.state),
        liveness=Liveness(w.liveness),
        attached=w.server_id is not None if attached is None else attached,
        labels=frozenset(w.labels),
        parallel=w.parallel,
        host=host_of(w.host),
        used=dict(used),
        tenants=frozenset(w.tenants),
        capacity=resources.of(w.capacity),
        reserved=reserved,
    )


def worker_views(
    workers: Sequence[WorkerRecord],
    used: Mapping[str, Mapping[str, int]],
    reserved: Mapping[str, Resources] | None = None,
) -> list[WorkerView]:
    reserved = reserved or {}
    return [view_of(w, used.get(w.id, {}), reserved=reserved.get(w.id, NOTHING)) for w in workers]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    record: WorkerRecord
    state: str
    no_lease: str
    used: dict[str, int]
    slots: dict[str, int]
    reserved: Resources  # what its live leases asked for
    tenants: list[str]  # those of its tenants the caller may see named ([]: it serves every one)


def named_for(caller: Caller) -> frozenset[str] | None:
    """The tenants whose names `caller` may see in fleet listings; None: every tenant."""
    return None if caller.fleet_wide else caller.tenants


def shown_tenants(named: frozenset[str] | None, tenants: Sequence[str]) -> list[str] | None:
    """A worker's tenants as a caller who may see `named` is shown them; None: not shown.

    A worker of other tenants only is a private machine of theirs: it is not listed at all,
    so its name and its tenants' stay theirs. One that also serves the caller's tenants shows
    those only.
    """
    if named is None or not tenants:
        return list(tenants)
    mine = [t for t in tenants if t in named]
    return mine or None


@dataclass(frozen=True, slots=True)
class Starting:
    """A provisioned worker asked for but not attached yet (it has no worker row)."""

    name: str
    pool: str
    age: float


async def list_workers(
    db: Database,
    pools: Mapping[str, PoolSpec],
    caller: Caller,
    quotas: placement.Quotas | None = None,
) -> tuple[list[WorkerRow], list[Starting]]:
    """Workers with why each gets no lease, and provisioned ones still starting.

    A provisioned worker that ended (drained and stopped, or confirmed gone) is not listed; nor
    is a worker of other tenants only, unless `caller` is fleet-wide (see shown_tenants).
    """
    named = named_for(caller)
    async with db.begin() as conn:
        records = await workers_q.list_all(conn)
        used = await leases_q.live_counts(conn, [w.id for w in records])
        reserved = await leases_q.reserved(conn, [w.id for w in records])
        waiting = await jobs_q.queued(conn, limit=500)
        usage = await leases_q.usage_of_tenants(conn, sorted({j.tenant for j in waiting}))
        ended = await prov_q.ended_names(conn)
        starting = await prov_q.starting_without_worker(conn)
        dead = await tokens_q.dead_credentials(conn, [w.name for w in records])
    held_back = frozenset(
        t
        for t, (running, gpus) in usage.items()
        if quotas is not None
        and placement.over_quota(NOTHING, t, running=running, gpus=gpus, quota=quotas.of(t))
    )
    rows = []
    for w in records:
        tenants = shown_tenants(named, w.tenants)
        if w.name in ended or tenants is None:
            continue
        view = view_of(w, used.get(w.id, {}), reserved=reserved.get(w.id, NOTHING))
        pool = pools.get(w.pool)
        fits = [
            placement.JobWant.of(j)
            for j in waiting
            if (j.pool in (None, w.pool))
            and pool is not None
            and j.kind in pool.slots
            and placement.carries(view, frozenset(j.labels))
            and placement.serves(view, j.tenant)
        ]
        rows.append(
            WorkerRow(
                record=w,
                state=shown_worker_state(
                    view.state,
                    view.liveness,
                    attached=view.attached,
                    credential=dead.get(w.name, ""),
                ),
                no_lease=placement.no_lease_reason(
                    view, pool, bool(fits), waiting=fits, held_back=held_back
                ),
                used=dict(used.get(w.id, {})),
                slots=dict(pool.slots) if pool else {},
                reserved=view.reserved,
                tenants=tenants,
            )
        )
    return rows, [Starting(r["name"], r["pool"], r["age"]) for r in starting]


async def set_state(
    db: Database, caller: Caller, *, name: str, state: WorkerState, request_id: str = ""
) -> tuple[WorkerRecord, str]:
    """Drain, disable or enable a worker; the server holding its socket is told.

    Security: a tenant's operator changes only its tenants' own machines (check_may_change).
    Returns the worker and the word `worker list` shows for it now: an exited worker enabled
    is still `offline`, not `active`.
    """
    async with db.begin() as conn:
        tenants = await workers_q.tenants_for_update(conn, name=name)
        if tenants is None:
            raise NotFound(f"no worker named {name!r}")
        check_may_change(caller, name, tenants)
        worker = await workers_q.set_state(conn, name=name, state=str(state))
        if worker is None:
            raise NotFound(f"no worker named {name!r}")
        await workers_q.notify(conn, {"op": "state", "worker": name, "state": str(state)})
        await audit.record(conn, caller, f"worker.{_verb(state)}", name, request_id=request_id)
        dead = await tokens_q.dead_credentials(conn, [name])
    shown = shown_worker_state(
        state,
        Liveness(worker.liveness),
        attached=worker.server_id is not None,
        credential=dead.get(name, ""),
    )
    return worker, shown


async def remove(db: Database, caller: Caller, *, name: str, request_id: str = "") -> None:
    """Forget a worker that holds no lease and is not attached (`berth worker rm`).

    Conflict naming why otherwise. Its token, if any, stays: a worker started again with it
    attaches again, as a new row.
    """
    async with db.begin() as conn:
        worker = await workers_q.lock(conn, name=name)
        if worker is None:
            raise NotFound(f"no worker named {name!r}")
        live = sorted(j for j, _ in await leases_q.live_of(conn, worker.id))
        if live:
            jobs = ", ".join(str(j) for j in live[:10]) + (", ..." if len(live) > 10 else "")
            raise Conflict(
                f"worker {name} holds {len(live)} lease(s) now (job {jobs}): wait for them to "
                "end (berth worker drain stops new ones) or cancel them, then remove it"
            )
        attached = worker.server_id is not None and worker.liveness in (
            Liveness.OK,
            Liveness.UNREACHABLE,
        )
        if attached:
            raise Conflict(
                f"worker {name} is attached to a server ({worker.liveness}): stop its process "
                "first; `worker rm` removes workers that are gone"
            )
        await workers_q.delete(conn, worker_id=worker.id)
        await audit.record(conn, caller, "worker.removed", name, request_id=request_id)


async def forget_lost(db: Database, *, after: float) -> list[str]:
    """Remove workers lost or gone for `after` seconds that hold no lease (the leader's loop)."""
    async with db.begin() as conn:
        names = await workers_q.forget(conn, after=after)
        for name in names:
            await audit.record(conn, "service:berth", "worker.forgotten", name, after=after)
    return names


def check_may_change(caller: Caller, name: str, tenants: Sequence[str]) -> None:
    """Return when `caller` may drain, disable or enable the worker serving `tenants`.

    SPEC section 8: draining or disabling a worker that serves other tenants needs an admin or
    a fleet-wide operator, or one tenant's operator could stop every tenant's work. A worker of
    other tenants only is answered as one that does not exist, as listings hide it.
    """
    if caller.fleet_wide:
        return
    if shown_tenants(caller.tenants, tenants) is None:
        raise NotFound(f"no worker named {name!r}")
    needs = "only an admin or a fleet-wide operator (one bound to no tenant) may change its state"
    if not tenants:
        raise Forbidden(f"worker {name!r} serves every tenant (a fleet-wide worker): {needs}")
    if not set(tenants) <= caller.tenants:
        raise Forbidden(f"worker {name!r} also serves tenants that are not yours: {needs}")


def _verb(state: WorkerState) -> str:
    return {"active": "enabled", "draining": "drained", "disabled": "disabled"}[str(state)]


def parse_state(verb: str) -> WorkerState:
    states = {
        "drain": WorkerState.DRAINING,
        "disable": WorkerState.DISABLED,
        "enable": WorkerState.ACTIVE,
    }
    if verb not in states:
        raise Invalid(f"unknown action {verb!r}; one of drain, disable, enable")
    return states[verb]


async def status(
    db: Database,
    in_force: InForce,
    *,
    tenants: frozenset[str] | None = None,
    shown_to: Caller | None = None,
) -> dict[str, Any]:
    """Capacity and queues; per-tenant counts and limits only of the tenants in `tenants`.

    `tenants`: those the caller may see named (named_for); None: every one. Pools show the
    values in force (berth.toml with the limits this server applies), and each limit its
    berth.toml value, reason, who and when: those `shown_to` may see (all when None; a pool's
    own limits name no tenant).
    """
    async with db.begin() as conn:
        depth = await jobs_q.queue_depth(conn)
        running = await jobs_q.running_counts(conn)
        workers = await workers_q.list_all(conn)
        counts = await prov_q.counts(conn)
        health = await prov_q.health(conn)
    return {
        "pools": {
            name: {
                "slots": dict(p.slots),
                "max_load": p.max_load,
                "min_memory_gb": p.min_memory_gb,
                "min_disk_gb": p.min_disk_gb,
                "provisioner": _provisioner(in_force, name, counts, health),
                "workers": sum(1 for w in workers if w.pool == name and w.server_id),
                "limits": in_force.shown(pool=name),
            }
            for name, p in in_force.pools().items()
        },
        "queued": [{"pool": p, "kind": k, "jobs": n} for p, k, n in depth],
        "running": sum(running.values()),
        "running_by_tenant": {t: n for t, n in running.items() if tenants is None or t in tenants},
        "limits": in_force.shown(to=shown_to),
    }


def _provisioner(
    in_force: InForce,
    pool: str,
    counts: Mapping[str, Mapping[str, int]],
    health: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any] | None:
    """The provisioner in force: its max, its workers by state, and failed starts.

    Failed starts say why, and when the next start is tried.
    """
    p = in_force.config.pools.get(pool)
    if p is None or p.provisioner is None:
        return None
    h = health.get(pool, {})
    return {
        "max": p.provisioner.max,
        "idle_seconds": p.provisioner.idle_seconds,
        "provider": p.provisioner.compute.provider,
        "workers": dict(counts.get(pool, {})),
        "failures": int(h.get("failures", 0)),
        "last_error": str(h.get("last_error", "")),
        "retry_in": round(float(h.get("retry_in", 0.0)), 1),
    }
