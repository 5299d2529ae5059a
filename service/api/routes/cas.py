"""/api/v1/cas (tenants) and /api/v1/workers/cas (workers): the artifact store over HTTP.

Both follow the store contract of service/cas/http.py (`.id`, HEAD, GET with ranges, PUT), so
`HttpStore` is their client. Tenants reach a blob only through a reference their tenant holds
(else 404, as for a blob that does not exist); the tenant is `?tenant=T`, else the caller's own
(an admin's: "default"). A tenant's PUT answers 201 with the same body whether or not the
store had the blob (its body is read and checked either way), so it tells nothing of other
tenants; past [cas] max_blob_gb it is 413, past the tenant's max_stored_gb 429, each naming the
key. Workers: a fleet-wide one reaches any blob, a tenant-bound one its tenants' blobs;
`PUT ...?job=ID&epoch=N&what=output|log|upload` references the blob for that job while
(job, epoch) is the worker's live lease (409 when stale). `.list` and DELETE are served
only by `berth cas serve`, to the installation.
"""

from typing import Any

from litestar import Request, Response, get, head, put
from litestar.params import FromPath, FromQuery

from service.api import cas_wire
from service.api.identity import identify, request_id, runtime_of
from service.api.runtime import Runtime
from service.auth.permissions import Perm
from service.core.errors import Unavailable
from service.domain.artifacts import access, server_store
from service.domain.artifacts.server_store import ServerStore

TENANT = "/api/v1/cas"
WORKER = server_store.WORKER_PATH
BLOB = "{sha256:str}"


def _server(rt: Runtime) -> ServerStore:
    if rt.cas is None:
        raise Unavailable("this server offers no artifact store")
    return rt.cas


# -- tenants ---------------------------------------------------------------------------------


@get(f"{TENANT}/.id", opt={"perm": Perm.JOBS_READ}, exception_handlers=cas_wire.ERRORS)
async def store_id(request: Request[Any, Any, Any]) -> Response[str]:
    """The store's id."""
    return cas_wire.store_id(await _server(runtime_of(request)).id())


@head(f"{TENANT}/{BLOB}", opt={"perm": Perm.JOBS_READ}, exception_handlers=cas_wire.ERRORS)
async def stat_blob(
    request: Request[Any, Any, Any], sha256: FromPath[str], tenant: FromQuery[str | None] = None
) -> Response[None]:
    """The blob's size as Content-Length; 404 unless the tenant holds it."""
    rt = runtime_of(request)
    caller = await identify(request)
    size = await access.stat(rt.db, _server(rt), caller, sha256=sha256, tenant=tenant)
    return cas_wire.head(size)


@get(f"{TENANT}/{BLOB}", opt={"perm": Perm.JOBS_READ}, exception_handlers=cas_wire.ERRORS)
async def get_blob(
    request: Request[Any, Any, Any], sha256: FromPath[str], tenant: FromQuery[str | None] = None
) -> Response[Any]:
    """The blob (verified as it streams) or a `Range` of it; 404 unless the tenant holds it."""
    rt = runtime_of(request)
    caller = await identify(request)
    server = _server(rt)
    size = await access.stat(rt.db, server, caller, sha256=sha256, tenant=tenant)
    return await cas_wire.send(server, sha256, size, request.headers.get("range"))


@put(
    f"{TENANT}/{BLOB}",
    opt={"perm": Perm.JOBS_WRITE},
    exception_handlers=cas_wire.ERRORS,
    request_max_body_size=None,  # streamed to the store, never held: any size
)
async def put_blob(
    request: Request[Any, Any, Any], sha256: FromPath[str], tenant: FromQuery[str | None] = None
) -> Response[dict[str, Any]]:
    """Upload a blob for the tenant: 201 kept (new or not), 422 not its hash, 413/429 a bound."""
    rt = runtime_of(request)
    caller = await identify(request)
    result = await access.upload(
        rt.db,
        _server(rt),
        caller,
        sha256=sha256,
        chunks=request.stream(),
        tenant=tenant,
        in_force=rt.effective,
        declared=cas_wire.content_length(request),
        request_id=request_id(request),
    )
    return cas_wire.kept(result)


# -- workers ---------------------------------------------------------------------------------


@get(f"{WORKER}/.id", opt={"perm": Perm.WORKER_PROTOCOL}, exception_handlers=cas_wire.ERRORS)
async def worker_store_id(request: Request[Any, Any, Any]) -> Response[str]:
    """The store's id (a worker checks it against its welcome's)."""
    return cas_wire.store_id(await _server(runtime_of(request)).id())


@head(f"{WORKER}/{BLOB}", opt={"perm": Perm.WORKER_PROTOCOL}, exception_handlers=cas_wire.ERRORS)
async def worker_stat_blob(
    request: Request[Any, Any, Any], sha256: FromPath[str]
) -> Response[None]:
    rt = runtime_of(request)
    caller = await identify(request)
    return cas_wire.head(await access.worker_stat(rt.db, _server(rt), caller, sha256=sha256))


@get(f"{WORKER}/{BLOB}", opt={"perm": Perm.WORKER_PROTOCOL}, exception_handlers=cas_wire.ERRORS)
async def worker_get_blob(request: Request[Any, Any, Any], sha256: FromPath[str]) -> Response[Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    server = _server(rt)
    size = await access.worker_stat(rt.db, server, caller, sha256=sha256)
    return await cas_wire.send(server, sha256, size, request.headers.get("range"))


@put(
    f"{WORKER}/{BLOB}",
    opt={"perm": Perm.WORKER_PROTOCOL},
    exception_handlers=cas_wire.ERRORS,
    request_max_body_size=None,
)
async def worker_put_blob(
    request: Request[Any, Any, Any],
    sha256: FromPath[str],
    job: FromQuery[int | None] = None,
    epoch: FromQuery[int | None] = None,
    what: FromQuery[str | None] = None,
) -> Response[dict[str, Any]]:
    """A worker's write; with job, epoch and what, referenced for the job's tenant (fenced)."""
    rt = runtime_of(request)
    caller = await identify(request)
    result = await access.worker_upload(
        rt.db,
        _server(rt),
        caller,
        sha256=sha256,
        chunks=request.stream(),
        job=job,
        epoch=epoch,
        what=what,
        in_force=rt.effective,
    )
    # As a tenant's: a tenant-bound worker is a tenant's own machine.
    return cas_wire.kept(result)


HANDLERS = [
    store_id,
    stat_blob,
    get_blob,
    put_blob,
    worker_store_id,
    worker_stat_blob,
    worker_get_blob,
    worker_put_blob,
]
