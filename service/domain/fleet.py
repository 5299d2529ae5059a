"""The fleet as people see it: workers with why they get no lease, pools, status; drain and co."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.auth.callers import Caller
from service.core import placement
from service.core.errors import Invalid, NotFound
from service.core.placement import HostSample, PoolSpec, WorkerView
from service.core.states import Liveness, WorkerState, shown_worker_state
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import leases as leases_q
from service.db.queries import workers as workers_q
from service.db.records import WorkerRecord
from service.domain import audit


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
    w: WorkerRecord, used: Mapping[str, int], *, attached: bool | None = None
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
    )


def worker_views(
    workers: Sequence[WorkerRecord], used: Mapping[str, Mapping[str, int]]
) -> list[WorkerView]:
    return [view_of(w, used.get(w.id, {})) for w in workers]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    record: WorkerRecord
    state: str
    no_lease: str
    used: dict[str, int]
    slots: dict[str, int]


async def list_workers(db: Database, pools: Mapping[str, PoolSpec]) -> list[WorkerRow]:
    async with db.begin() as conn:
        records = await workers_q.list_all(conn)
        used = await leases_q.live_counts(conn, [w.id for w in records])
        waiting = await jobs_q.queued(conn, limit=500)
    rows = []
    for w in records:
        view = view_of(w, used.get(w.id, {}))
        pool = pools.get(w.pool)
        has_job = any(
            (j.pool in (None, w.pool))
            and pool is not None
            and j.kind in pool.slots
            and set(j.labels) <= set(w.labels)
            and (not w.tenants or j.tenant in w.tenants)
            for j in waiting
        )
        rows.append(
            WorkerRow(
                record=w,
                state=shown_worker_state(view.state, view.liveness),
                no_lease=placement.no_lease_reason(view, pool, has_job),
                used=dict(used.get(w.id, {})),
                slots=dict(pool.slots) if pool else {},
            )
        )
    return rows


async def set_state(
    db: Database, caller: Caller, *, name: str, state: WorkerState, request_id: str = ""
) -> WorkerRecord:
    """Drain, disable or enable a worker; the server holding its socket is told."""
    async with db.begin() as conn:
        worker = await workers_q.set_state(conn, name=name, state=str(state))
        if worker is None:
            raise NotFound(f"no worker named {name!r}")
        await workers_q.notify(conn, {"op": "state", "worker": name, "state": str(state)})
        await audit.record(conn, caller, f"worker.{_verb(state)}", name, request_id=request_id)
    return worker


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
    db: Database, pools: Mapping[str, PoolSpec], *, tenants: frozenset[str] | None = None
) -> dict[str, Any]:
    """Capacity and queues; per-tenant counts only for the tenants the caller holds."""
    async with db.begin() as conn:
        depth = await jobs_q.queue_depth(conn)
        running = await jobs_q.running_counts(conn)
        workers = await workers_q.list_all(conn)
    return {
        "pools": {
            name: {
                "slots": dict(p.slots),
                "workers": sum(1 for w in workers if w.pool == name and w.server_id),
            }
            for name, p in pools.items()
        },
        "queued": [{"pool": p, "kind": k, "jobs": n} for p, k, n in depth],
        "running": sum(running.values()),
        "running_by_tenant": {t: n for t, n in running.items() if tenants is None or t in tenants},
        "limits": [],
    }
