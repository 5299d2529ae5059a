"""Reading and writing blobs in the server's store, every byte checked against the blob's name.

A corrupt blob is refused with the reason (CorruptBlob, 422) and removed when this process holds
the blobs (`local`, `s3`), so that an upload heals it; a remote store heals itself. A write
behind a pending reference (`put_referenced`) drops that reference when the write fails.
"""

import contextlib
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from service.cas import base
from service.core.errors import BerthError, Conflict, Invalid, NotFound
from service.db.engine import Database
from service.db.queries import artifacts as artifacts_q
from service.domain.artifacts.server_store import ServerStore

log = structlog.get_logger(__name__)


class CorruptBlob(BerthError):
    """Content that does not hash to its name: a body on upload, or a stored blob on read."""

    status = 422


@dataclass(frozen=True, slots=True)
class Stored:
    sha256: str
    size: int
    created: bool  # False: the store had it already (the body was still read and checked)


def check_sha(name: str) -> str:
    try:
        return base.check_name(name)
    except base.BadName as exc:
        raise Invalid(str(exc)) from None


async def stored_size(server: ServerStore, sha256: str) -> int:
    size = await server.store.stat(sha256)
    if size is None:
        raise NotFound(f"no blob {sha256}")
    return size


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
    return await put(server, check_sha(sha256), chunks)


async def delete(server: ServerStore, sha256: str) -> bool:
    """Remove a blob (the installation's collector, through `berth cas serve`)."""
    return await server.store.delete(check_sha(sha256))


async def size_of(server: ServerStore, sha256: str) -> int:
    """The blob's size; NotFound when the store lacks it (`berth cas serve`)."""
    return await stored_size(server, check_sha(sha256))


async def put(server: ServerStore, sha256: str, chunks: AsyncIterable[bytes]) -> Stored:
    existed = await server.store.stat(sha256) is not None
    try:
        _, size = await server.store.put(chunks, sha256=sha256)
    except base.Corrupt:
        # The store read the whole body before it could tell; nothing of it was kept.
        raise CorruptBlob(
            f"the body does not hash to its name {sha256}; nothing was kept"
        ) from None
    return Stored(sha256=sha256, size=size, created=not existed)


async def put_referenced(
    db: Database, server: ServerStore, ref_id: int, sha256: str, chunks: AsyncIterable[bytes]
) -> Stored:
    """Put the blob behind a pending reference; drop the reference when the put fails."""
    try:
        return await put(server, sha256, chunks)
    except BaseException:
        # Also on cancellation (the client went away); a row this misses lets go in a day.
        with contextlib.suppress(BerthError):  # the database is away: the day does it
            async with db.begin() as conn:
                await artifacts_q.drop(conn, ref_id=ref_id)
        raise


async def complete(conn: AsyncConnection, ref_id: int, size: int) -> None:
    if not await artifacts_q.complete(conn, ref_id=ref_id, size=size):
        raise Conflict("the upload outlasted its reservation; upload it again")
