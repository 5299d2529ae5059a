"""/api/v1/workers, /api/v1/pools, /api/v1/status: the fleet and its capacity."""

from typing import Any

from litestar import Request, delete, get, post
from litestar.params import FromPath

from service.api.identity import identify, request_id, runtime_of
from service.auth.permissions import Perm
from service.core import resources
from service.domain import fleet


def worker_json(row: fleet.WorkerRow) -> dict[str, Any]:
    w = row.record
    host = w.host or {}
    return {
        "name": w.name,
        "pool": w.pool,
        "state": row.state,
        "labels": w.labels,
        "tenants": row.tenants,
        "seen_seconds_ago": round(w.seen_seconds_ago, 1),
        "no_lease": row.no_lease,
        "load": host.get("load"),
        "cpus": host.get("cpus"),
        "free_memory_gb": host.get("free_memory_gb"),
        "free_disk_gb": host.get("free_disk_gb"),
        "gpus": host.get("gpus", []),
        "devices": host.get("devices", []),
        "capacity": resources.of(w.capacity).as_dict(),
        "reserved": row.reserved.as_dict(),
        "slots": {k: {"used": row.used.get(k, 0), "total": n} for k, n in row.slots.items()},
        "parallel": w.parallel,
        "attached": w.server_id is not None,
        "python": w.python,
        "env_digest": w.env_digest,
        "version": w.version,
    }


@get("/api/v1/workers", opt={"perm": Perm.FLEET_READ})
async def list_workers(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    rt = runtime_of(request)
    rows, starting = await fleet.list_workers(rt.db, rt.pools, await identify(request), rt.quotas)
    return [worker_json(r) for r in rows] + [starting_json(s, rt) for s in starting]


def starting_json(s: fleet.Starting, rt: Any) -> dict[str, Any]:  # noqa: ANN401  (Runtime)
    """A provisioned worker not attached yet, shaped like the others."""
    slots = rt.pools[s.pool].slots if s.pool in rt.pools else {}
    return {
        "name": s.name,
        "pool": s.pool,
        "state": "starting",
        "labels": [],
        "tenants": [],
        "seen_seconds_ago": round(s.age, 1),
        "no_lease": "starting",
        "load": None,
        "cpus": None,
        "free_memory_gb": None,
        "free_disk_gb": None,
        "gpus": [],
        "devices": [],
        "capacity": resources.Resources().as_dict(),
        "reserved": resources.Resources().as_dict(),
        "slots": {k: {"used": 0, "total": n} for k, n in slots.items()},
        "parallel": 0,
        "attached": False,
        "python": "",
        "env_digest": "",
        "version": "",
    }


@post("/api/v1/workers/{name:str}/{action:str}", opt={"perm": Perm.FLEET_WRITE}, status_code=200)
async def set_worker_state(
    request: Request[Any, Any, Any], name: FromPath[str], action: FromPath[str]
) -> dict[str, Any]:
    """Drain | disable | enable; a tenant's operator only its tenants' own workers.

    `state` is the word `worker list` shows now, `set` the order.
    """
    rt = runtime_of(request)
    caller = await identify(request)
    state = fleet.parse_state(action)
    worker, shown = await fleet.set_state(
        rt.db, caller, name=name, state=state, request_id=request_id(request)
    )
    return {"name": worker.name, "state": shown, "set": worker.state}


@delete("/api/v1/workers/{name:str}", opt={"perm": Perm.FLEET_WRITE}, status_code=200)
async def remove_worker(request: Request[Any, Any, Any], name: FromPath[str]) -> dict[str, Any]:
    """Forget a worker that is gone and holds no lease; 409 naming why otherwise."""
    rt = runtime_of(request)
    caller = await identify(request)
    await fleet.remove(rt.db, caller, name=name, request_id=request_id(request))
    return {"name": name, "removed": True}


@get("/api/v1/pools", opt={"perm": Perm.FLEET_READ})
async def pools(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    """Each pool with the values in force on this server, and the limits that set them."""
    rt = runtime_of(request)
    status = await fleet.status(rt.db, rt.limits)
    return [{"name": name, **p} for name, p in sorted(status["pools"].items())]


@get("/api/v1/status", opt={"perm": Perm.FLEET_READ})
async def status(request: Request[Any, Any, Any]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    out = await fleet.status(rt.db, rt.limits, tenants=fleet.named_for(caller), shown_to=caller)
    out["server"] = {"id": rt.server_id, "version": rt.version}
    return out
