"""Artifacts: the server's store, and who may put and read which blob in it (SPEC 3).

Contracts:
- A tenant reads a blob only through a complete reference it holds (`db.queries.artifacts`
  says when one holds); otherwise NotFound, the same answer as for a blob that does not exist,
  so existence does not leak. Knowing a hash is not enough.
- An upload commits its reference (pending: size -1, it grants no read) BEFORE the blob is
  written, under the blob's shared lock, and completes it after; a failed write drops it. So
  the collector (`artifact_gc`) either sees the reference or deleted the blob before it was
  made, and the writer then writes the blob anew (the store's put skips an existing blob).
- A fleet-wide worker (no tenants) reads and writes any blob; a tenant-bound one only blobs its
  tenants hold. A worker's write for (job, epoch) references the blob for the job's tenant only
  while that is the worker's live lease (fenced like reports); without a job it is a plain write.
- A corrupt blob is refused with the reason (CorruptBlob, 422) and removed when this process
  holds the blobs (`local`, `s3`), so that an upload heals it; a remote store heals itself.
- Other domain code references blobs for jobs with `reference_held` (what a tenant names:
  inputs, code; NotFound unless it holds them) or `reference` (what was just written for it).
- An upload says nothing about other tenants: its answer is the same whether or not the store
  had the blob, and its body is always read and checked against its name.
- Bounds (SPEC section 8): a tenant's upload is at most [cas] max_blob_gb; what a tenant's
  references keep (distinct blobs) stays within its max_stored_gb for uploads, a job's writes
  through this server and reported outputs and saves. Each refusal names its key and leaves
  nothing referenced, and nothing in the store when it comes before the last byte. Concurrent
  writes each count what was complete when they began, so together they may pass a bound by
  what they bring at once.
"""

import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy.ext.asyncio import AsyncConnection

from service import protocol
from service.auth.callers import Caller, Kind
from service.cas import base, factory
from service.cas.http import NO_HEADERS
from service.config import Config
from service.core.bounds import TenantBounds, gb_bytes, shown_bytes
from service.core.errors import (
    BerthError,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    OverBound,
    StaleEpoch,
    TooLarge,
)
from service.db.engine import Database
from service.db.queries import artifacts as artifacts_q
from service.db.queries.artifacts import Ref
from service.domain import audit
from service.domain.tokens import DEFAULT_TENANT, check_name, tenant_to_write

log = structlog.get_logger(__name__)

DAY = 86400.0
WORKER_PATH = "/api/v1/workers/cas"  # the workers' base URL under the server's
# What a worker's write may reference for its job: its outputs, its log, what it saved through
# its relay (`upload`). Outputs and saves count against the tenant's max_stored_gb.
WORKER_WRITES = ("output", "log", "upload")
SERVE_KEY_INFO = b"berth cas serve v1"
MAX_ID = 2**63 - 1  # what the bigint columns hold
MAX_EPOCH = 2**31 - 1


class CorruptBlob(BerthError):
    """Content that does not hash to its name: a body on upload, or a stored blob on read."""

    status = 422


@dataclass
class ServerStore:
    """The server's store and how long references hold blobs in it.

    `heals`: the blobs are here (local, s3), so a corrupt one is removed on sight; a remote
    (http, cached) removes its own.
    """

    store: base.Store
    heals: bool
    gc_days: float
    _id: str | None = field(default=None, repr=False)

    @property
    def gc(self) -> float:
        """Seconds a reference holds its blob after what made it ended."""
        return self.gc_days * DAY

    async def id(self) -> str:
        if self._id is None:
            self._id = await self.store.id()
        return self._id


@dataclass(frozen=True, slots=True)
class Stored:
    sha256: str
    size: int
    created: bool  # False: the store had it already (the body was still read and checked)


def serve_key(secret_key: bytes) -> str:
    """The bearer key of `berth cas serve`: derived from the installation's secret key."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SERVE_KEY_INFO)
    return hkdf.derive(secret_key).hex()


def open_server_store(config: Config, *, home: Path, secret_key: bytes) -> ServerStore:
    """The store `[cas]` names (default: a folder under $BERTH_HOME/cas, 0700). No I/O yet."""
    cas = config.cas
    remote = cas.provider in ("http", "cached")
    headers = {"Authorization": f"Bearer {serve_key(secret_key)}"} if remote else NO_HEADERS
    try:
        store = factory.open_store(cas, home=home, headers=headers)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    return ServerStore(store=store, heals=not remote, gc_days=cas.gc_days)


async def access(
    config: Config, server: ServerStore, *, server_url: str, secret_key: bytes
) -> protocol.CasAccess:
    """How a worker reaches this server's store: the CasAccess of its welcome."""
    cas = config.cas
    store_id = await server.id()
    match cas.provider:
        case "local":  # through this server, with the worker's own credential
            url = server_url.rstrip("/") + WORKER_PATH
            return protocol.CasAccess(id=store_id, provider="http", url=url, token="")
        case "http" | "cached":  # the remote `berth cas serve`, with the installation's key
            token = serve_key(secret_key)
            return protocol.CasAccess(id=store_id, provider="http", url=cas.url, token=token)
        case "s3":
            return protocol.CasAccess(
                id=store_id,
                provider="s3",
                bucket=cas.bucket,
                prefix=cas.prefix,
                endpoint_url=cas.endpoint_url,
                region=cas.region,
            )
    raise Invalid(f"cas.provider: unknown store {cas.provider!r}")


def for_worker(access: protocol.CasAccess, tenants: list[str]) -> protocol.CasAccess:
    """The store access a worker's welcome carries.

    A tenant-bound worker reaches the store only through this server, which limits it to its
    tenants' blobs; the store's own key (or bucket) would reach every tenant's.
    """
    if not tenants or (access.provider == "http" and access.url.startswith("/")):
        return access
    return protocol.CasAccess(id=access.id, provider="http", url=WORKER_PATH, token="")


def check_sha(name: str) -> str:
    try:
        return base.check_name(name)
    except base.BadName as exc:
        raise Invalid(str(exc)) from None


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


async def _size(server: ServerStore, sha256: str) -> int:
    size = await server.store.stat(sha256)
    if size is None:
        raise NotFound(f"no blob {sha256}")
    return size


# -- tenants ---------------------------------------------------------------------------------


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
        room = await _room(conn, in_force.tenant_bounds(scope), [sha], gc=server.gc)
        if room is not None and declared is not None:
            room.check(declared)
        ref_id = await artifacts_q.insert(
            conn, tenant=scope, sha256=sha, size=-1, what="upload", job_id=None, by=str(caller)
        )
    bounded = _counted(chunks, max_blob, lambda n: _too_large(n, max_blob, counted=True))
    if room is not None:
        bounded = _counted(bounded, room.left, room.refuse_counted)
    stored = await _write(db, server, ref_id, sha, bounded)
    async with db.begin() as conn:
        await _complete(conn, ref_id, stored.size)
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


@dataclass(frozen=True, slots=True)
class _Room:
    """What new blobs may still bring into a tenant's share of the store (its max_stored_gb)."""

    bounds: TenantBounds
    used: int  # bytes of the distinct blobs its references keep now

    @property
    def left(self) -> int:
        return self.bounds.max_stored_bytes - self.used

    def check(self, size: int) -> None:
        if size > self.left:
            raise self.refusal(size)

    def refuse_counted(self, size: int) -> OverBound:
        """The refusal of a body found too large as it streams (`size`: bytes so far)."""
        return self.refusal(size, counted=True)

    def refusal(self, size: int, *, counted: bool = False) -> OverBound:
        more = f"over {shown_bytes(max(self.left, 0))} more" if counted else shown_bytes(size)
        return OverBound(
            f"tenant {self.bounds.tenant} keeps {shown_bytes(self.used)} in the store; {more} "
            f"would pass its {self.bounds.key('max_stored_gb')} = "
            f"{shown_bytes(self.bounds.max_stored_bytes)}; nothing was kept"
        )


async def _room(
    conn: AsyncConnection, bounds: TenantBounds, shas: Sequence[str], *, gc: float
) -> _Room | None:
    """The room a write of `shas` has in the tenant's share.

    None when nothing bounds it: no bound, or the tenant's references keep all these blobs
    already (they add nothing).
    """
    if bounds.max_stored_bytes <= 0:
        return None
    held = await artifacts_q.held_sizes(conn, tenant=bounds.tenant, shas=shas, gc=gc)
    if set(shas) <= set(held):
        return None
    return _Room(bounds, await artifacts_q.stored_bytes(conn, tenant=bounds.tenant, gc=gc))


async def _counted(
    chunks: AsyncIterable[bytes], limit: int, refuse: Callable[[int], BerthError]
) -> AsyncIterator[bytes]:
    """`chunks`, refused (raising `refuse(bytes so far)`) once they pass `limit` bytes."""
    n = 0
    async for chunk in chunks:
        n += len(chunk)
        if n > limit:
            raise refuse(n)
        yield chunk


async def stat(
    db: Database, server: ServerStore, caller: Caller, *, sha256: str, tenant: str | None
) -> int:
    """The blob's size, when the caller's tenant (or `tenant`) holds it; NotFound otherwise."""
    sha = check_sha(sha256)
    await _held(db, server, _read_tenants(caller, tenant), sha)
    return await _size(server, sha)


# -- workers ---------------------------------------------------------------------------------


def _worker(caller: Caller) -> None:
    if caller.kind is not Kind.WORKER:
        raise Forbidden("only workers use this route")


async def worker_stat(db: Database, server: ServerStore, caller: Caller, *, sha256: str) -> int:
    """The blob's size: any blob for a fleet-wide worker, its tenants' for a tenant-bound one."""
    _worker(caller)
    sha = check_sha(sha256)
    if caller.tenants:
        await _held(db, server, sorted(caller.tenants), sha)
    return await _size(server, sha)


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
        return await _put(server, sha, chunks)
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
        room = await _room(conn, in_force.tenant_bounds(scope), [sha], gc=server.gc)
        ref_id = await artifacts_q.insert(
            conn, tenant=scope, sha256=sha, size=-1, what=what, job_id=job, by=str(caller)
        )
    if room is not None:
        chunks = _counted(chunks, room.left, room.refuse_counted)
    stored = await _write(db, server, ref_id, sha, chunks)
    async with db.begin() as conn:
        await _complete(conn, ref_id, stored.size)
    return stored


# -- for other domain code -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Named:
    """A blob a tenant names for its job (an input): referenced only if the tenant holds it."""

    tenant: str
    sha256: str
    what: str
    job_id: int


@dataclass(frozen=True, slots=True)
class Reported:
    """A blob a worker reports for its live job (an output, a saved artifact)."""

    worker_tenants: tuple[str, ...]  # () for a fleet-wide worker
    tenant: str
    sha256: str
    size: int
    what: str
    job_id: int


async def reference_held(
    conn: AsyncConnection, named: Sequence[Named], *, by: str, gc_days: float
) -> None:
    """Reference for their jobs blobs their tenants already hold (inputs).

    NotFound when a tenant holds no complete reference to one, the same answer as for a blob
    that does not exist. In the caller's transaction, under the blobs' shared locks; a few
    statements for any number of blobs.
    """
    if not named:
        return
    await artifacts_q.lock_shared(conn, *(check_sha(n.sha256) for n in named))
    sizes: dict[str, dict[str, int]] = {}
    for tenant in {n.tenant for n in named}:
        shas = [n.sha256 for n in named if n.tenant == tenant]
        sizes[tenant] = await artifacts_q.held_sizes(
            conn, tenant=tenant, shas=shas, gc=gc_days * DAY
        )
    if missing := next((n for n in named if n.sha256 not in sizes[n.tenant]), None):
        raise NotFound(f"no blob {missing.sha256}")
    await artifacts_q.insert_many(
        conn,
        [Ref(n.tenant, n.sha256, sizes[n.tenant][n.sha256], n.what, n.job_id, by) for n in named],
    )


async def reference(conn: AsyncConnection, refs: Sequence[Ref]) -> None:
    """Reference blobs written to the store for their tenants (code, a job's output segments).

    The caller vouches that each blob is in the store and came from that tenant: use it for
    what the server wrote itself; for anything a tenant names, `reference_held`; for what a
    worker reports, `reference_reported`.
    """
    for r in refs:
        check_sha(r.sha256)
        if r.size < 0:
            raise Invalid("a blob's size is >= 0")
    await artifacts_q.insert_many(conn, refs)


async def reference_reported(
    conn: AsyncConnection, reported: Sequence[Reported]
) -> set[tuple[int, str]]:
    """Reference blobs workers report for their live jobs; the (job, sha256) accepted.

    A write through this server for the job already referenced it. Otherwise only a fleet-wide
    worker is taken at its word (it reaches the store directly, and a blob written before its
    reference is kept by the collector for [cas] gc_days after it first sees it); a
    tenant-bound one could name another tenant's hash, so its report is refused unless the
    fenced write made it.
    """
    for r in reported:
        check_sha(r.sha256)
    written = await artifacts_q.written_for_jobs(conn, [(r.job_id, r.sha256) for r in reported])
    new = {
        (r.job_id, r.sha256): r
        for r in reported
        if (r.job_id, r.sha256) not in written and not r.worker_tenants
    }
    for r in reported:
        if r.worker_tenants and (r.job_id, r.sha256) not in written:
            log.warning("reported_blob_refused", job=r.job_id, sha256=r.sha256, what=r.what)
    await reference(
        conn,
        [
            Ref(r.tenant, r.sha256, r.size, r.what, r.job_id, f"job:{r.job_id}")
            for r in new.values()
        ],
    )
    return written | set(new)


async def drop_unlisted_outputs(
    conn: AsyncConnection, listed: Sequence[tuple[int, Sequence[str]]]
) -> None:
    """Let go of each job's output references to blobs its result does not list (job, shas).

    What a result does not list was not kept, and grants nothing.
    """
    await artifacts_q.drop_outputs_except(conn, listed)


@dataclass(frozen=True, slots=True)
class Bringing:
    """Blobs a report would reference for a tenant, all or none (a job's outputs, one save)."""

    key: object  # the caller's handle on it, e.g. (job, epoch)
    tenant: str
    blobs: tuple[tuple[str, int], ...]  # (sha256, size)


async def over_stored(
    conn: AsyncConnection, bringing: Sequence[Bringing], in_force: Config
) -> dict[object, str]:
    """Of `bringing`, in order, those that would take their tenant past its max_stored_gb.

    key -> the refusal, naming the key. Blobs the tenant's references keep already (a write
    through this server referenced them) add nothing.
    """
    refused: dict[object, str] = {}
    gc = in_force.cas.gc_days * DAY
    for tenant in dict.fromkeys(b.tenant for b in bringing):
        bounds = in_force.tenant_bounds(tenant)
        if bounds.max_stored_bytes <= 0:
            continue
        mine = [b for b in bringing if b.tenant == tenant]
        shas = [sha for b in mine for sha, _ in b.blobs]
        counted = set(await artifacts_q.held_sizes(conn, tenant=tenant, shas=shas, gc=gc))
        room = _Room(bounds, await artifacts_q.stored_bytes(conn, tenant=tenant, gc=gc))
        for b in mine:
            new = {sha: size for sha, size in b.blobs if sha not in counted}
            size = sum(new.values())
            if size > room.left:
                refused[b.key] = room.refusal(size).message
                continue
            counted |= set(new)
            room = _Room(bounds, room.used + size)
    return refused


# -- reading and writing the store -----------------------------------------------------------


async def read(
    server: ServerStore, sha256: str, *, start: int = 0, end: int | None = None
) -> AsyncGenerator[bytes, None]:
    """The blob's bytes [start, end) to send, the whole blob verified.

    NotFound or CorruptBlob come before the first byte when the store can tell by then (a blob
    of one chunk); a corruption found later is raised by the stream, and the server drops the
    connection rather than complete a wrong blob.
    """
    stream = server.store.get(sha256, start=start, end=end)
    try:
        first = await anext(stream, None)
    except base.Missing:
        await stream.aclose()
        raise NotFound(f"no blob {sha256}") from None
    except base.Corrupt as exc:
        await stream.aclose()
        raise await _corrupt(server, sha256, exc) from None
    return _rest(server, sha256, first, stream)


async def _rest(
    server: ServerStore, sha256: str, first: bytes | None, stream: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(stream):
        if first is None:
            return
        yield first
        try:
            async for chunk in stream:
                yield chunk
        except base.Corrupt as exc:
            raise await _corrupt(server, sha256, exc) from None


async def _corrupt(server: ServerStore, sha256: str, exc: base.Corrupt) -> CorruptBlob:
    """Log a corrupt stored blob and remove it when it is here, so an upload can heal it."""
    log.warning("cas_blob_corrupt", sha256=sha256, reason=str(exc), removed=server.heals)
    if server.heals:
        with contextlib.suppress(base.CasError):
            await server.store.delete(sha256)
    return CorruptBlob(f"{exc}; it was removed, upload it again" if server.heals else str(exc))


async def write(server: ServerStore, sha256: str, chunks: AsyncIterable[bytes]) -> Stored:
    """Store a blob checked against its name, referencing nothing (`berth cas serve`)."""
    return await _put(server, check_sha(sha256), chunks)


async def delete(server: ServerStore, sha256: str) -> bool:
    """Remove a blob (the installation's collector, through `berth cas serve`)."""
    return await server.store.delete(check_sha(sha256))


async def size_of(server: ServerStore, sha256: str) -> int:
    """The blob's size; NotFound when the store lacks it (`berth cas serve`)."""
    return await _size(server, check_sha(sha256))


async def _put(server: ServerStore, sha256: str, chunks: AsyncIterable[bytes]) -> Stored:
    existed = await server.store.stat(sha256) is not None
    try:
        _, size = await server.store.put(chunks, sha256=sha256)
    except base.Corrupt:
        # The store read the whole body before it could tell; nothing of it was kept.
        raise CorruptBlob(
            f"the body does not hash to its name {sha256}; nothing was kept"
        ) from None
    return Stored(sha256=sha256, size=size, created=not existed)


async def _write(
    db: Database, server: ServerStore, ref_id: int, sha256: str, chunks: AsyncIterable[bytes]
) -> Stored:
    """Put the blob behind a pending reference; drop the reference when the put fails."""
    try:
        return await _put(server, sha256, chunks)
    except BaseException:
        # Also on cancellation (the client went away); a row this misses lets go in a day.
        with contextlib.suppress(BerthError):  # the database is away: the day does it
            async with db.begin() as conn:
                await artifacts_q.drop(conn, ref_id=ref_id)
        raise


async def _complete(conn: AsyncConnection, ref_id: int, size: int) -> None:
    if not await artifacts_q.complete(conn, ref_id=ref_id, size=size):
        raise Conflict("the upload outlasted its reservation; upload it again")
