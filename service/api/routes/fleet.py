"""/api/v1/workers, /api/v1/pools, /api/v1/status: the fleet and its capacity."""

from typing import Annotated, Literal

import msgspec
from litestar import delete, get, post
from litestar.params import PathParameter

from service.api import contract, deps
from service.auth.permissions import Perm
from service.core import resources
from service.domain import fleet
from service.views import (
    GpuView,
    PoolView,
    RemovedView,
    ResourcesView,
    SlotsView,
    StatusView,
    WorkerStateView,
    WorkerView,
)

WorkerName = Annotated[str, PathParameter(description="the worker's name", max_length=128)]


def _resources(r: resources.Resources) -> ResourcesView:
    return ResourcesView(cpus=r.cpus, memory_mb=r.memory_mb, gpus=r.gpus)


def worker_view(row: fleet.WorkerRow) -> WorkerView:
    w = row.record
    host = w.host or {}
    return WorkerView(
        name=w.name,
        pool=w.pool,
        state=row.state,
        labels=w.labels,
        tenants=row.tenants,
        seen_seconds_ago=round(w.seen_seconds_ago, 1),
        no_lease=row.no_lease,
        load=host.get("load"),
        cpus=host.get("cpus"),
        free_memory_gb=host.get("free_memory_gb"),
        free_disk_gb=host.get("free_disk_gb"),
        gpus=list(host.get("gpus", [])),
        devices=msgspec.convert(host.get("devices", []), list[GpuView]),
        capacity=_resources(resources.of(w.capacity)),
        reserved=_resources(row.reserved),
        slots={k: SlotsView(used=row.used.get(k, 0), total=n) for k, n in row.slots.items()},
        parallel=w.parallel,
        attached=w.server_id is not None,
        python=w.python,
        env_digest=w.env_digest,
        version=w.version,
    )


def starting_view(s: fleet.Starting, pools: deps.Pools) -> WorkerView:
    """A provisioned worker not attached yet, shaped like the others."""
    slots = pools[s.pool].slots if s.pool in pools else {}
    return WorkerView(
        name=s.name,
        pool=s.pool,
        state="starting",
        labels=[],
        tenants=[],
        seen_seconds_ago=round(s.age, 1),
        no_lease="starting",
        load=None,
        cpus=None,
        free_memory_gb=None,
        free_disk_gb=None,
        gpus=[],
        devices=[],
        capacity=_resources(resources.NOTHING),
        reserved=_resources(resources.NOTHING),
        slots={k: SlotsView(used=0, total=n) for k, n in slots.items()},
        parallel=0,
        attached=False,
        python="",
        env_digest="",
        version="",
    )


@get(
    "/api/v1/workers",
    opt={"perm": Perm.FLEET_READ},
    operation_id="listWorkers",
    responses=contract.errors(),
)
async def list_workers(
    db: deps.Db, caller: deps.Caller, pools: deps.Pools, quotas: deps.TenantQuotas
) -> list[WorkerView]:
    """Workers with why each gets no lease, and provisioned ones still starting."""
    rows, starting = await fleet.list_workers(db, pools, caller, quotas)
    return [worker_view(r) for r in rows] + [starting_view(s, pools) for s in starting]


@post(
    "/api/v1/workers/{name:str}/{action:str}",
    opt={"perm": Perm.FLEET_WRITE},
    status_code=200,
    operation_id="setWorkerState",
    responses=contract.errors(404),
)
async def set_worker_state(
    name: WorkerName,
    action: Annotated[
        Literal["drain", "disable", "enable"], PathParameter(description="the order")
    ],
    db: deps.Db,
    caller: deps.Caller,
    request_id: deps.RequestId,
) -> WorkerStateView:
    """Drain | disable | enable; a tenant's operator only its tenants' own workers.

    `state` is the word `worker list` shows now, `set` the order.
    """
    state = fleet.parse_state(action)
    worker, shown = await fleet.set_state(db, caller, name=name, state=state, request_id=request_id)
    return WorkerStateView(name=worker.name, state=shown, set=worker.state)


@delete(
    "/api/v1/workers/{name:str}",
    opt={"perm": Perm.FLEET_WRITE},
    status_code=200,
    operation_id="removeWorker",
    responses=contract.errors(404, 409),
)
async def remove_worker(
    name: WorkerName, db: deps.Db, caller: deps.Caller, request_id: deps.RequestId
) -> RemovedView:
    """Forget a worker that is gone and holds no lease; 409 naming why otherwise."""
    await fleet.remove(db, caller, name=name, request_id=request_id)
    return RemovedView(name=name, removed=True)


@get(
    "/api/v1/pools",
    opt={"perm": Perm.FLEET_READ},
    operation_id="listPools",
    responses=contract.errors(),
)
async def pools(db: deps.Db, in_force: deps.InForce) -> list[PoolView]:
    """Each pool with the values in force on this server, and the limits that set them."""
    found = await fleet.status(db, in_force)
    return [msgspec.convert({"name": n, **p}, PoolView) for n, p in sorted(found["pools"].items())]


@get(
    "/api/v1/status",
    opt={"perm": Perm.FLEET_READ},
    operation_id="status",
    responses=contract.errors(),
)
async def status(
    db: deps.Db, caller: deps.Caller, in_force: deps.InForce, server: deps.Server
) -> StatusView:
    """Capacity and queues; per-tenant counts and limits only of the tenants the caller sees."""
    out = await fleet.status(db, in_force, tenants=fleet.named_for(caller), shown_to=caller)
    return msgspec.convert({**out, "server": server}, StatusView)
