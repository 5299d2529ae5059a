"""The worker side of the server: attach, heartbeats, leases given back, detach, expiry.

Reports about jobs are domain/reports.py. A worker token with tenants makes a worker that serves
only those tenants (its row's `tenants`, which placement reads).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from service import protocol
from service.auth.callers import Caller, Kind
from service.core.errors import Forbidden
from service.core.placement import PoolSpec
from service.core.states import JobState
from service.db.driver import Conn
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import leases as leases_q
from service.db.queries import reports as reports_q
from service.db.queries import tokens as tokens_q
from service.db.queries import workers as workers_q
from service.db.records import JobRecord, TokenRecord, WorkerRecord
from service.domain import audit, tokens

log = structlog.get_logger(__name__)


class Refusal(Forbidden):
    """The worker may not attach; the reason is sent to it and it exits non-zero."""


@dataclass(frozen=True, slots=True)
class Attached:
    worker: WorkerRecord
    drop: tuple[tuple[int, int], ...]  # held copies whose lease is gone: kill them
    freed: int  # live leases it no longer holds, freed at once


async def attach(
    db: Database,
    caller: Caller,
    hello: protocol.Hello,
    *,
    server_id: str,
    pools: Mapping[str, PoolSpec],
    store_id: str = "",
) -> Attached:
    """Admit a worker, or raise Refusal with the reason it will print."""
    if hello.cas and hello.cas != store_id:
        # A worker with a store of its own must share the server's: jobs' inputs and outputs
        # would otherwise be somewhere the server cannot see.
        raise Refusal(
            f"this worker's artifact store (id {hello.cas}) is not the server's "
            f"(id {store_id or 'none'}); give it the server's [cas] or none"
        )
    if caller.kind is not Kind.WORKER:
        raise Refusal("only a worker credential may attach as a worker")
    if caller.name in tokens.RESERVED_WORKER_NAMES:  # (a proxy's claims may name anything)
        raise Refusal(f"a worker may not be named {caller.name!r}: it is reserved")
    if hello.cas and caller.tenants:
        raise Refusal(
            "a worker bound to tenants reaches the artifact store only through the server "
            "(which keeps it to its tenants' blobs); remove [cas] from its berth.toml"
        )
    if hello.protocol != protocol.PROTOCOL_VERSION:
        raise Refusal(
            f"protocol {hello.protocol} is not the server's ({protocol.PROTOCOL_VERSION}); "
            "install the server's berth version"
        )
    if not caller.identity:  # every worker credential names one (tokens, proxy rules)
        raise Refusal("this credential cannot attach a worker: it has no identity")
    async with db.driver() as conn:
        bound = (
            await tokens_q.live_by_name(conn, name=caller.credential) if caller.credential else None
        )
        pool, labels = _placement_of(hello, bound)
        if pool not in pools:
            raise Refusal(f"unknown pool {pool!r}; the server has {', '.join(sorted(pools))}")
        previous = await _claim_name(conn, caller)
        worker = await workers_q.attach(
            conn,
            name=caller.name,
            identity=caller.identity,
            pool=pool,
            instance=hello.instance,
            server_id=server_id,
            labels=labels,
            tenants=sorted(caller.tenants),
            parallel=hello.parallel,
            host=_host(hello.host),
            capacity=msgspec.structs.asdict(hello.capacity),
            python=hello.python,
            env_digest=hello.env_digest,
            version=hello.berth_version,
        )
        if worker is None:  # another credential inserted the name since _claim_name looked
            raise Refusal(f"worker name {caller.name!r} was just taken by another credential")
        held = [(j, e) for j, e in hello.held]
        # Security: resumed only when they are this identity's leases (the row is its own) and
        # it serves their tenant; anything else it says it holds is given back, never adopted.
        live_held = await leases_q.live_among(
            conn, worker_id=worker.id, held=held, tenants=sorted(caller.tenants) or None
        )
        # A lease the worker does not hold is running nowhere (a restarted worker holds none):
        # free it now instead of waiting out the silence window.
        live = set(await leases_q.live_of(conn, worker.id))
        freed = await leases_q.expire(conn, worker_ids=[worker.id], only=sorted(live - live_held))
        if freed:
            await jobs_q.notify_jobs(conn)
        await audit.record(conn, caller, "worker.attached", worker.name, pool=pool)
    log.info(
        "worker_attached",
        worker=worker.name,
        pool=worker.pool,
        restarted=previous not in (None, hello.instance),
        freed=len(freed),
    )
    drop = tuple(sorted(set(held) - live_held))
    return Attached(worker=worker, drop=drop, freed=len(freed))


async def _claim_name(conn: Conn, caller: Caller) -> str | None:
    """Make the worker name the caller's to attach under; its previous instance, if it had one.

    A name belongs to the identity whose row bears it. Another identity takes it only when that
    row is neither live nor holding a lease: the row (and its lease history) goes, so nothing
    of the old identity's carries over. Rows from before identities ("") are adopted.
    """
    found = await workers_q.holder(conn, name=caller.name)
    if found is None:
        return None
    if found.identity in ("", caller.identity):
        return found.instance
    if found.busy:
        raise Refusal(
            f"worker name {caller.name!r} belongs to another credential and is in use (attached, "
            "or holding leases until its silence window ends); choose another name"
        )
    await workers_q.remove(conn, worker_id=found.id)
    return None


def _placement_of(hello: protocol.Hello, bound: TokenRecord | None) -> tuple[str, tuple[str, ...]]:
    """The worker's pool and labels.

    Its credential's when a join token bound them (the server decides), else its hello's.
    """
    if bound is not None and bound.pool is not None:
        if hello.pool is not None and hello.pool != bound.pool:
            raise Refusal(f"this worker's credential binds pool {bound.pool!r}, not {hello.pool!r}")
        return bound.pool, tuple(bound.labels or ())
    if hello.pool is None:
        raise Refusal("say which pool this worker serves (berth worker --pool)")
    return hello.pool, hello.labels


def _host(host: protocol.Host) -> dict[str, Any]:
    return {
        "cpus": host.cpus,
        "load": host.load,
        "free_memory_gb": host.free_memory_gb,
        "free_disk_gb": host.free_disk_gb,
        "gpus": list(host.gpus),
        "devices": [msgspec.structs.asdict(d) for d in host.devices],
    }


async def release(db: Database, worker: WorkerRecord, released: Sequence[tuple[int, int]]) -> int:
    """Leases a stopping worker gave back (their copies are dead): re-queue the jobs now."""
    async with db.begin() as conn:
        freed = await leases_q.expire(conn, worker_ids=[worker.id], only=list(released))
        if freed:
            await jobs_q.notify_jobs(conn)
        await audit.record(conn, f"worker:{worker.name}", "worker.left", worker.name)
    return len(freed)


async def fail_lease(db: Database, job: JobRecord, reason: str) -> None:
    """End a lease the server cannot hand out (e.g. its secret is gone): the job fails."""
    async with db.begin() as conn:
        worker = await workers_q.get(conn, name=job.worker or "")
        if worker is not None:
            await reports_q.finish_many(
                conn,
                [(job.id, job.attempt, worker.id, worker.name, str(JobState.FAILED), None, reason)],
            )


async def beats(
    db: Database, *, server_id: str, beats: Sequence[tuple[str, protocol.Host]]
) -> set[str]:
    """Record many heartbeats in one statement; returns the worker ids written."""
    async with db.driver() as conn:
        return await workers_q.beat_many(
            conn, server_id=server_id, beats=[(w, _host(h)) for w, h in beats]
        )


async def detach(db: Database, *, worker_id: str, server_id: str, gone: bool) -> None:
    async with db.begin() as conn:
        await workers_q.detach(conn, worker_id=worker_id, server_id=server_id, gone=gone)


async def holds_nothing(db: Database, worker_id: str) -> bool:
    async with db.begin() as conn:
        return not await leases_q.live_of(conn, worker_id)


async def expire_silent(db: Database, *, unreachable: float, evict: float) -> dict[str, int]:
    """The two stages of silence, one pass: mark unreachable, then expire leases of the lost."""
    async with db.begin() as conn:
        unreachable_now = await workers_q.mark_unreachable(conn, after=unreachable)
        lost = await workers_q.mark_lost(conn, after=unreachable + evict)
        moved: list[dict[str, Any]] = []
        if lost:
            moved = await leases_q.expire(conn, worker_ids=[w for w, _ in lost])
            if moved:
                await jobs_q.notify_jobs(conn)
            for _, name in lost:
                await audit.record(conn, "service:berth", "worker.lost", name)
    for name in unreachable_now:
        log.warning("worker_unreachable", worker=name)
    for _, name in lost:
        log.warning("worker_lost", worker=name, leases_expired=len(moved))
    return {"unreachable": len(unreachable_now), "lost": len(lost), "requeued": len(moved)}


async def live_job(db: Database, worker: WorkerRecord, *, job: int, epoch: int) -> JobRecord | None:
    """The job, if (job, epoch) is this worker's live lease; None once the lease ended."""
    async with db.begin() as conn:
        if not await reports_q.live_jobs(conn, [(job, epoch, worker.id)]):
            return None
        return await jobs_q.get(conn, job, tenants=None)
