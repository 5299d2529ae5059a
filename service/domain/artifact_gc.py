"""The artifact collector: delete blobs that no reference holds any more (the leader's loop).

A pass: (1) blobs whose every reference stopped holding them are deleted, each in its own
transaction under the blob's exclusive lock, re-checked inside it (`delete_if_unheld`), so an
upload or reference made meanwhile either waits for the deletion and writes the blob anew, or
was committed first and keeps it; (2) on a sweep, blobs in the store that no reference row
names (a worker's write not yet reported, a crashed writer's) get a note that holds them for
[cas] gc_days, after which (1) deletes them; (3) rows that stopped holding long ago go.

Idempotent: a pass cut short is finished by the next (or another leader's).
"""

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from service.cas import base
from service.db.engine import Database
from service.db.queries import artifacts as artifacts_q
from service.domain.artifacts.server_store import ServerStore

log = structlog.get_logger(__name__)

BATCH = 500
SWEEP_BATCH = 1000


@dataclass
class Collected:
    deleted: int = 0  # blobs
    noted: int = 0  # blobs found with no reference, now held for gc_days
    forgotten: int = 0  # reference rows


async def collect(
    db: Database, server: ServerStore, *, sweep: bool, batch: int = BATCH
) -> Collected:
    """One pass; `sweep` also lists the store for blobs no reference names."""
    out = Collected()
    async with db.begin() as conn:
        due = await artifacts_q.unheld(conn, gc=server.gc, limit=batch)
    for sha in due:
        try:
            async with db.begin() as conn:
                out.deleted += await delete_if_unheld(conn, server, sha256=sha)
        except base.CasError as exc:  # the store failed on this one: the next pass retries it
            log.warning("cas_delete_failed", sha256=sha, error=str(exc))
    if sweep:
        out.noted = await note_unclaimed(db, server)
    async with db.begin() as conn:
        out.forgotten += await artifacts_q.delete_long_expired(conn, gc=server.gc)
    return out


async def delete_if_unheld(conn: AsyncConnection, server: ServerStore, *, sha256: str) -> bool:
    """Lock the blob; when nothing holds it, delete it and its references. True when deleted.

    Runs in the caller's transaction, which keeps the lock until it ends.
    """
    await artifacts_q.lock(conn, sha256)
    if await artifacts_q.holds(conn, sha256=sha256, gc=server.gc):
        return False
    await server.store.delete(sha256)
    await artifacts_q.forget(conn, sha256=sha256)
    return True


async def note_unclaimed(db: Database, server: ServerStore) -> int:
    """List the store; note each blob that no reference row names. How many were noted."""
    noted = 0
    found: list[tuple[str, int]] = []
    async with contextlib.aclosing(server.store.list()) as blobs:
        async for entry in blobs:
            found.append(entry)
            if len(found) >= SWEEP_BATCH:
                noted += await _note(db, found)
                found = []
    return noted + await _note(db, found)


async def _note(db: Database, found: Sequence[tuple[str, int]]) -> int:
    if not found:
        return 0
    async with db.begin() as conn:
        named = await artifacts_q.known(conn, shas=[sha for sha, _ in found])
        stray = [(sha, size) for sha, size in found if sha not in named]
        await artifacts_q.note_unclaimed(conn, blobs=stray)
    return len(stray)
