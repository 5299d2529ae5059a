"""A tenant's share of the store: what its references keep against its `max_stored_gb`.

Uploads, a job's writes through this server and reported outputs and saves are each checked
against the room left (SPEC section 8). Each refusal names its key and leaves nothing
referenced. Concurrent writes each count what was complete when they began, so together they
may pass a bound by what they bring at once.
"""

from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from service.config import Config
from service.core.bounds import TenantBounds, shown_bytes
from service.core.errors import BerthError, OverBound
from service.db.driver import Conn
from service.db.queries import artifacts as artifacts_q
from service.domain.artifacts.server_store import DAY


@dataclass(frozen=True, slots=True)
class Room:
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


async def room_for(
    conn: Conn, bounds: TenantBounds, shas: Sequence[str], *, gc: float
) -> Room | None:
    """The room a write of `shas` has in the tenant's share.

    None when nothing bounds it: no bound, or the tenant's references keep all these blobs
    already (they add nothing).
    """
    if bounds.max_stored_bytes <= 0:
        return None
    held = await artifacts_q.held_sizes(conn, tenant=bounds.tenant, shas=shas, gc=gc)
    if set(shas) <= set(held):
        return None
    return Room(bounds, await artifacts_q.stored_bytes(conn, tenant=bounds.tenant, gc=gc))


async def counted(
    chunks: AsyncIterable[bytes], limit: int, refuse: Callable[[int], BerthError]
) -> AsyncIterator[bytes]:
    """`chunks`, refused (raising `refuse(bytes so far)`) once they pass `limit` bytes."""
    n = 0
    async for chunk in chunks:
        n += len(chunk)
        if n > limit:
            raise refuse(n)
        yield chunk


@dataclass(frozen=True, slots=True)
class Bringing:
    """Blobs a report would reference for a tenant, all or none (a job's outputs, one save)."""

    key: object  # the caller's handle on it, e.g. (job, epoch)
    tenant: str
    blobs: tuple[tuple[str, int], ...]  # (sha256, size)


async def over_stored(
    conn: Conn, bringing: Sequence[Bringing], in_force: Config
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
        room = Room(bounds, await artifacts_q.stored_bytes(conn, tenant=tenant, gc=gc))
        for b in mine:
            new = {sha: size for sha, size in b.blobs if sha not in counted}
            size = sum(new.values())
            if size > room.left:
                refused[b.key] = room.refusal(size).message
                continue
            counted |= set(new)
            room = Room(bounds, room.used + size)
    return refused
