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

from typing import Annotated, Any, Literal

from litestar import Request, Response, get, head, put
from litestar.params import FromQuery, HeaderParameter, PathParameter, QueryParameter

from service.api import body, cas_wire, contract, deps
from service.auth.permissions import Perm
from service.domain.artifacts import access, server_store
from service.views import StoredView

TENANT = "/api/v1/cas"
WORKER = server_store.WORKER_PATH
BLOB = "{sha256:str}"

Sha256 = Annotated[
    str,
    PathParameter(
        description="the blob's name: its sha256, 64 lowercase hex digits",
        pattern=r"\A[0-9a-f]{64}\Z",
    ),
]
Tenant = Annotated[
    str | None,
    QueryParameter(description="whose blob (default: the caller's tenant)", **body.NAME_PARAM),
]
Range = Annotated[
    str | None,
    HeaderParameter(
        name="range",
        description="bytes=A-B, bytes=A- or bytes=-N",
        max_length=200,
        # In the document only: cas_wire.byte_range refuses another, saying what it takes.
        schema_extra={"pattern": cas_wire.RANGE_PATTERN},
    ),
]
# What a store answers besides a BerthError: a bad name 400, a corrupt blob 422, down 503.
READ = (404, 422)
WRITE = (404, 409, 413, 422, 429)


# -- tenants ---------------------------------------------------------------------------------


@get(
    f"{TENANT}/.id",
    opt={"perm": Perm.JOBS_READ},
    exception_handlers=cas_wire.ERRORS,
    operation_id="casStoreId",
    responses=contract.errors(),
    operation_class=contract.TextOperation,
)
async def store_id(store: deps.Store) -> Response[str]:
    """The store's id."""
    return cas_wire.store_id(await store.id())


@head(
    f"{TENANT}/{BLOB}",
    opt={"perm": Perm.JOBS_READ},
    exception_handlers=cas_wire.ERRORS,
    operation_id="casStatBlob",
    responses=contract.errors(*READ),
    operation_class=contract.BlobStatOperation,
)
async def stat_blob(
    sha256: Sha256, db: deps.Db, store: deps.Store, caller: deps.Caller, tenant: Tenant = None
) -> Response[None]:
    """The blob's size as Content-Length; 404 unless the tenant holds it."""
    size = await access.stat(db, store, caller, sha256=sha256, tenant=tenant)
    return cas_wire.head(size)


@get(
    f"{TENANT}/{BLOB}",
    opt={"perm": Perm.JOBS_READ},
    exception_handlers=cas_wire.ERRORS,
    operation_id="casGetBlob",
    responses=contract.errors(*READ),
    operation_class=contract.BlobReadOperation,
)
async def get_blob(
    *,
    sha256: Sha256,
    db: deps.Db,
    store: deps.Store,
    caller: deps.Caller,
    tenant: Tenant = None,
    byte_range: Range = None,
) -> Response[Any]:
    """The blob (verified as it streams) or a `Range` of it; 404 unless the tenant holds it."""
    size = await access.stat(db, store, caller, sha256=sha256, tenant=tenant)
    return await cas_wire.send(store, sha256, size, byte_range)


@put(
    f"{TENANT}/{BLOB}",
    opt={"perm": Perm.JOBS_WRITE},
    exception_handlers=cas_wire.ERRORS,
    request_max_body_size=None,  # streamed to the store, never held: any size
    status_code=201,
    operation_id="casPutBlob",
    responses=contract.errors(*WRITE),
    operation_class=contract.BlobWriteOperation,
)
async def put_blob(
    *,
    request: Request[Any, Any, Any],
    sha256: Sha256,
    db: deps.Db,
    store: deps.Store,
    caller: deps.Caller,
    effective: deps.Effective,
    request_id: deps.RequestId,
    tenant: Tenant = None,
) -> Response[StoredView]:
    """Upload a blob for the tenant: 201 kept (new or not), 422 not its hash, 413/429 a bound."""
    result = await access.upload(
        db,
        store,
        caller,
        sha256=sha256,
        chunks=request.stream(),
        tenant=tenant,
        in_force=effective,
        declared=cas_wire.content_length(request),
        request_id=request_id,
    )
    return cas_wire.kept(result)


# -- workers ---------------------------------------------------------------------------------


@get(
    f"{WORKER}/.id",
    opt={"perm": Perm.WORKER_PROTOCOL},
    exception_handlers=cas_wire.ERRORS,
    operation_id="workerCasStoreId",
    responses=contract.errors(),
    operation_class=contract.TextOperation,
)
async def worker_store_id(store: deps.Store) -> Response[str]:
    """The store's id (a worker checks it against its welcome's)."""
    return cas_wire.store_id(await store.id())


@head(
    f"{WORKER}/{BLOB}",
    opt={"perm": Perm.WORKER_PROTOCOL},
    exception_handlers=cas_wire.ERRORS,
    operation_id="workerCasStatBlob",
    responses=contract.errors(*READ),
    operation_class=contract.BlobStatOperation,
)
async def worker_stat_blob(
    sha256: Sha256, db: deps.Db, store: deps.Store, caller: deps.Caller
) -> Response[None]:
    """The blob's size, if the worker may read it (a tenant-bound one: its tenants' blobs)."""
    return cas_wire.head(await access.worker_stat(db, store, caller, sha256=sha256))


@get(
    f"{WORKER}/{BLOB}",
    opt={"perm": Perm.WORKER_PROTOCOL},
    exception_handlers=cas_wire.ERRORS,
    operation_id="workerCasGetBlob",
    responses=contract.errors(*READ),
    operation_class=contract.BlobReadOperation,
)
async def worker_get_blob(
    sha256: Sha256, db: deps.Db, store: deps.Store, caller: deps.Caller, byte_range: Range = None
) -> Response[Any]:
    """The blob, or a `Range` of it, if the worker may read it."""
    size = await access.worker_stat(db, store, caller, sha256=sha256)
    return await cas_wire.send(store, sha256, size, byte_range)


@put(
    f"{WORKER}/{BLOB}",
    opt={"perm": Perm.WORKER_PROTOCOL},
    exception_handlers=cas_wire.ERRORS,
    request_max_body_size=None,
    status_code=201,
    operation_id="workerCasPutBlob",
    responses=contract.errors(*WRITE),
    operation_class=contract.BlobWriteOperation,
)
async def worker_put_blob(
    *,
    request: Request[Any, Any, Any],
    sha256: Sha256,
    db: deps.Db,
    store: deps.Store,
    caller: deps.Caller,
    effective: deps.Effective,
    job: Annotated[int | None, QueryParameter(description="the job it is written for")] = None,
    epoch: Annotated[int | None, QueryParameter(description="the job's live lease")] = None,
    what: FromQuery[Literal["output", "log", "upload"] | None] = None,
) -> Response[StoredView]:
    """A worker's write; with job, epoch and what, referenced for the job's tenant (fenced)."""
    result = await access.worker_upload(
        db,
        store,
        caller,
        sha256=sha256,
        chunks=request.stream(),
        job=job,
        epoch=epoch,
        what=what,
        in_force=effective,
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
