"""Who may put and read which blob: tenants through their references, workers by their tokens.

- A tenant reads a blob only through a complete reference it holds (`db.queries.artifacts`
  says when one holds); otherwise NotFound, the same answer as for a blob that does not exist,
  so existence does not leak. Knowing a hash is not enough.
- An upload commits its reference (pending: size -1, it grants no read) BEFORE the blob is
  written, under the blob's shared lock, and completes it after; a failed write drops it. So
  the collector (`artifact_gc`) either sees the reference or deleted the blob before it was
  made, and the writer then writes the blob anew (the store's put skips an existing blob).
- An upload says nothing about other tenants: its answer is the same whether or not the store
  had the blob, and its body is always read and checked against its name. It is at most
  [cas] max_blob_gb, refused before anything is stored when it says so up front.
- A fleet-wide worker (no tenants) reads and writes any blob; a tenant-bound one only blobs its
  tenants hold. A worker's write for (job, epoch) references the blob for the job's tenant only
  while that is the worker's live lease (fenced like reports); without a job it is a plain write.
"""

from collections.abc import AsyncIterable

from service.auth.callers import Caller, Kind
from service.config import Config
from service.core.bounds import gb_bytes, shown_bytes
from service.core.errors import Forbidden, Invalid, NotFound, StaleEpoch, TooLarge
from service.db.engine import Database
from service.db.queries import artifacts as artifacts_q
from service.domain import audit
from service.domain.artifacts.blobs import (
    Stored,
    check_sha,
    complete,
    put,
    put_referenced,
    stored_size,
)
from service.domain.artifacts.room import counted, room_for
from service.domain.artifacts.server_store import ServerStore
from service.domain.tokens import DEFAULT_TENANT, check_name, tenant_to_write

# What a worker's write may reference for its job: its outputs, its log, what it saved through
# its relay (`upload`). Outputs and saves count against the tenant's max_stored_gb.
WORKER_WRITES = ("output", "log", "upload")
MAX_ID = 2**63 - 1  # what the bigint columns hold
MAX_EPOCH = 2**31 - 1


def _read_tenants(caller: Caller, wanted: str | None) -> list[str]:
    """The tenants whose references a read may go through (none: the answer is NotFound)."""
    if wanted:
        check_name(wanted, "tenant")
        return [wanted] if caller.sees(wanted) else []
    if caller.all_tenants:
        return [DEFAULT_TENANT]
    return sorted(caller.tenants)


async def _held(db: Database, server: ServerStore, tenants: list[str], sha256: str) -> None:
    """NotFound unless one of `tenants` holds a complete reference to the blob."""
    if tenants:
        async with db.begin() as conn:
            size = await artifacts_q.held_size(conn, tenants=tenants, sha256=sha256, gc=server.gc)
        if size is not None:
            return
    raise NotFound(f"no blob {sha256}")


async def upload(
    db: Database,
    server: ServerStore,
    caller: Caller,
    *,
    sha256: str,
    chunks: AsyncIterable[bytes],
    tenant: str | None,
    in_force: Config,
    declared: int | None = None,
    request_id: str = "",
) -> Stored:
    """Store a tenant's upload, checked against its name, and reference it for the tenant.

    `declared` is the body's Content-Length, when given: a body over a bound is refused before
    any of it is read; otherwise it is counted as it streams and refused once past the bound.
    """
    sha = check_sha(sha256)
    scope = tenant_to_write(caller, tenant, doing="upload")
    max_blob = gb_bytes(in_force.cas.max_blob_gb)
    if declared is not None and declared > max_blob:
        raise _too_large(declared, max_blob)
    async with db.begin() as conn:
        room = await room_for(conn, in_force.tenant_bounds(scope), [sha], gc=server.gc)
        if room is not None and declared is not None:
            room.check(declared)
        ref_id = await artifacts_q.insert(
            conn, tenant=scope, sha256=sha, size=-1, what="upload", job_id=None, by=str(caller)
        )
    bounded = counted(chunks, max_blob, lambda n: _too_large(n, max_blob, counted=True))
    if room is not None:
        bounded = counted(bounded, room.left, room.refuse_counted)
    stored = await put_referenced(db, server, ref_id, sha, bounded)
    async with db.begin() as conn:
        await complete(conn, ref_id, stored.size)
        await audit.record(
            conn, caller, "cas.uploaded", sha, tenant=scope, request_id=request_id, size=stored.size
        )
    return stored


def _too_large(size: int, bound: int, *, counted: bool = False) -> TooLarge:
    what = f"over {shown_bytes(bound)}" if counted else shown_bytes(size)
    return TooLarge(
        f"the blob is {what}, larger than cas.max_blob_gb = {shown_bytes(bound)} allows a "
        "tenant to upload; nothing was stored"
    )


async def stat(
    db: Database, server: ServerStore, caller: Caller, *, sha256: str, tenant: str | None
) -> int:
    """The blob's size, when the caller's tenant (or `tenant`) holds it; NotFound otherwise."""
    sha = check_sha(sha256)
    await _held(db, server, _read_tenants(caller, tenant), sha)
    return await stored_size(server, sha)


def _worker(caller: Caller) -> None:
    if caller.kind is not Kind.WORKER:
        raise Forbidden("only workers use this route")


async def worker_stat(db: Database, server: ServerStore, caller: Caller, *, sha256: str) -> int:
    """The blob's size: any blob for a fleet-wide worker, its tenants' for a tenant-bound one."""
    _worker(caller)
    sha = check_sha(sha256)
    if caller.tenants:
        await _held(db, server, sorted(caller.tenants), sha)
    return await stored_size(server, sha)


async def worker_upload(
    db: Database,
    server: ServerStore,
    caller: Caller,
    *,
    sha256: str,
    chunks: AsyncIterable[bytes],
    job: int | None,
    epoch: int | None,
    what: str | None,
    in_force: Config,
) -> Stored:
    """A worker's write; with (job, epoch, what) referenced for the job's tenant, fenced.

    A job's output or save that would take its tenant past its max_stored_gb is refused
    (OverBound, naming the key) before the store keeps it.
    """
    _worker(caller)
    sha = check_sha(sha256)
    if job is None:
        if epoch is not None or what is not None:
            raise Invalid("epoch and what go with job")
        if caller.tenants:  # a tenant's own machine writes only what its tenants hold
            await _held(db, server, sorted(caller.tenants), sha)
        return await put(server, sha, chunks)
    if epoch is None or what not in WORKER_WRITES:
        raise Invalid(f"a write for a job names its epoch and what ({', '.join(WORKER_WRITES)})")
    if not (1 <= job <= MAX_ID and 0 <= epoch <= MAX_EPOCH):
        raise StaleEpoch(f"job {job} epoch {epoch} is not a live lease of this worker")
    async with db.begin() as conn:
        scope = await artifacts_q.live_lease_tenant(
            conn, job_id=job, epoch=epoch, worker=caller.name
        )
        if scope is None or (caller.tenants and scope not in caller.tenants):
            raise StaleEpoch(f"job {job} epoch {epoch} is not a live lease of this worker")
        room = await room_for(conn, in_force.tenant_bounds(scope), [sha], gc=server.gc)
        ref_id = await artifacts_q.insert(
            conn, tenant=scope, sha256=sha, size=-1, what=what, job_id=job, by=str(caller)
        )
    if room is not None:
        chunks = counted(chunks, room.left, room.refuse_counted)
    stored = await put_referenced(db, server, ref_id, sha, chunks)
    async with db.begin() as conn:
        await complete(conn, ref_id, stored.size)
    return stored
