"""Provisioning's use cases: each provisioned pool's picture, and its workers' state changes.

Each change is its own short transaction.
The loop decides (core/provisioning.plan) and calls the provider; this module records. Intent
first: a worker's row (and its one-time join token) is written before the provider is asked to
start it, so whatever a leader killed mid-pass leaves, the next one finds in Postgres.
"""

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from service.auth.callers import Caller, Kind, Role
from service.config import Config, Pool
from service.core import provisioning as plans
from service.core.placement import room_left
from service.core.states import WorkerState
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import leases as leases_q
from service.db.queries import provisioning as prov_q
from service.db.queries import workers as workers_q
from service.domain import audit, joining

log = structlog.get_logger(__name__)

LOOP = Caller(Kind.SERVICE, "berth", Role.ADMIN, frozenset())  # signs what the loop does
JOIN_SECONDS = 3600.0  # a provisioned worker attaches long before its join token expires


def provisioned_pools(cfg: Config) -> dict[str, Pool]:
    return {name: pool for name, pool in sorted(cfg.pools.items()) if pool.provisioner}


@dataclass(frozen=True, slots=True)
class Picture:
    installation: str
    pools: dict[str, plans.PoolPicture]
    alive: list[dict[str, Any]]  # provisioned rows not ended, with live leases and attachment


async def picture(db: Database, cfg: Config) -> Picture:
    """Each provisioned pool as the plan needs it: demand, free slots, its workers, backoff."""
    pools = provisioned_pools(cfg)
    async with db.begin() as conn:
        await prov_q.mark_busy(conn)
        installation = await prov_q.installation(conn)
        groups = await prov_q.queued_groups(conn)
        usage = await prov_q.attached_usage(conn, list(pools))
        alive = await prov_q.alive(conn)
        health = await prov_q.health(conn)
    queued = _demand(cfg, pools, groups)
    free: dict[str, dict[str, int]] = {name: {} for name in pools}
    for w in usage:
        used = {k: int(v) for k, v in w["used"].items()}
        for kind, n in room_left(pools[w["pool"]].slots, used, w["parallel"]).items():
            free[w["pool"]][kind] = free[w["pool"]].get(kind, 0) + n
    out = {}
    for name, pool in pools.items():
        assert pool.provisioner is not None
        out[name] = plans.PoolPicture(
            name=name,
            slots=pool.slots,
            max=pool.provisioner.max,
            idle_seconds=pool.provisioner.idle_seconds,
            queued=queued.get(name, {}),
            free=free[name],
            workers=[
                plans.Provisioned(
                    name=r["name"],
                    state=_as_running(r),
                    live=int(r["live"] or 0),
                    idle_for=float(r["idle_for"]),
                )
                for r in alive
                if r["pool"] == name
            ],
            backing_off=health.get(name, {}).get("retry_in", 0.0) > 0,
        )
    return Picture(installation=installation, pools=out, alive=alive)


def _as_running(row: Mapping[str, Any]) -> str:
    """A starting worker that attached counts as running (the loop records it next)."""
    return "running" if row["state"] == "starting" and row["attached"] else str(row["state"])


def _demand(
    cfg: Config, pools: Mapping[str, Pool], groups: list[dict[str, Any]]
) -> dict[str, dict[str, int]]:
    """Queued jobs per provisioned pool and kind that a worker it starts could take.

    A job naming no pool counts for the first provisioned pool offering its kind, and only when
    no pool without a provisioner offers it (one start for it, not one per pool). Labels count
    as SPEC section 4 places: `require` needs every label on the worker, `prefer` runs anyway.
    """
    fixed_kinds = {
        kind for name, p in cfg.pools.items() if not p.provisioner for kind in p.slots
    } | {"default"}  # the built-in `serve` pool takes default jobs
    owner: dict[str, str] = {}
    for name, pool in pools.items():
        for kind in pool.slots:
            if kind not in fixed_kinds:
                owner.setdefault(kind, name)
    out: dict[str, dict[str, int]] = {}
    for g in groups:
        pool_name = g["pool"] if g["pool"] is not None else owner.get(g["kind"], "")
        found = pools.get(pool_name)
        if found is None or found.provisioner is None or g["kind"] not in found.slots:
            continue
        if not g["prefer"] and not set(g["labels"]) <= set(found.provisioner.labels):
            continue
        kinds = out.setdefault(pool_name, {})
        kinds[g["kind"]] = kinds.get(g["kind"], 0) + int(g["n"])
    return out


async def record_start(
    db: Database, *, pool: str, provider: str, most: int, labels: list[str], join: bool
) -> tuple[str, str] | None:
    """Write the intent to start one worker of `pool`: (its name, its join token or "").

    None when the pool has `most` alive already (another leader's start counted first).
    """
    name = joining.worker_name(pool)
    token = ""
    async with db.begin() as conn:
        if not await prov_q.record_intent(conn, name=name, pool=pool, provider=provider, most=most):
            return None
        if join:
            token, _ = await joining.create(
                conn,
                name=name,
                pool=pool,
                labels=labels,
                tenants=[],
                by=str(LOOP),
                expires_seconds=JOIN_SECONDS,
            )
        await audit.record(conn, LOOP, "worker.provisioned", name, pool=pool, provider=provider)
    return name, token


async def started(db: Database, name: str, provider_id: str) -> None:
    async with db.begin() as conn:
        await prov_q.set_state(conn, name=name, state="starting", provider_id=provider_id)


async def start_failed(db: Database, *, name: str, pool: str, reason: str) -> float:
    """A start that failed (refused, crashed, never attached): the row fails, the pool backs off.

    Returns the seconds until its next start may be tried.
    """
    async with db.begin() as conn:
        await prov_q.set_state(conn, name=name, state="failed", detail=reason)
        current = await prov_q.health(conn)
        failures = int(current.get(pool, {}).get("failures", 0)) + 1
        wait = plans.backoff_seconds(failures)
        await prov_q.start_failed(conn, pool=pool, reason=reason, backoff=wait)
        await audit.record(conn, LOOP, "worker.start_failed", name, pool=pool, reason=reason[:500])
    log.warning(
        "provision_start_failed",
        pool=pool,
        worker=name,
        reason=reason,
        failures=failures,
        retry_in=wait,
    )
    return wait


async def running(db: Database, *, name: str, pool: str) -> None:
    """It attached: it runs, and its pool's earlier failures are forgiven."""
    async with db.begin() as conn:
        if await prov_q.set_state(conn, name=name, state="running", only_from=("starting",)):
            await prov_q.started_fine(conn, pool=pool)


async def gone(db: Database, *, name: str, state: str, detail: str) -> int:
    """The provider confirms the worker ended: its row ends and its leases are free at once.

    Returns the jobs re-queued (or failed, attempts spent). SPEC section 5: a worker the
    provider confirms stopped frees its leases without waiting out the silence window.
    """
    async with db.begin() as conn:
        if not await prov_q.set_state(conn, name=name, state=state, detail=detail):
            return 0
        worker = await workers_q.get(conn, name=name)
        moved: list[dict[str, Any]] = []
        if worker is not None:
            moved = await leases_q.expire(conn, worker_ids=[worker.id])
            await workers_q.detach(
                conn, worker_id=worker.id, server_id=worker.server_id or "", gone=True
            )
            if moved:
                await jobs_q.notify_jobs(conn)
        await audit.record(conn, LOOP, "worker.stopped", name, detail=detail, requeued=len(moved))
    log.info(
        "provisioned_worker_gone", worker=name, state=state, detail=detail, requeued=len(moved)
    )
    return len(moved)


async def drain(db: Database, names: list[str]) -> None:
    """Drain these workers: they finish what they run, take nothing new, then exit."""
    for name in names:
        async with db.begin() as conn:
            await prov_q.set_state(
                conn, name=name, state="draining", only_from=("starting", "running")
            )
            if await workers_q.set_state(conn, name=name, state=str(WorkerState.DRAINING)):
                await workers_q.notify(
                    conn, {"op": "state", "worker": name, "state": str(WorkerState.DRAINING)}
                )
            await audit.record(conn, LOOP, "worker.drained", name)


async def is_alive(db: Database, name: str) -> bool:
    """Whether a provisioned worker's row is alive (starting, running or draining) right now."""
    async with db.begin() as conn:
        return await prov_q.is_alive(conn, name)


async def note(
    db: Database,
    cfg: Config,
    pool: str | None,
    *,
    labels: Collection[str] = (),
    require: bool = True,
) -> str:
    """What the provisioner of `pool` is doing about a waiting job, in words ("" for none).

    A job that requires `labels` its provisioner's workers do not carry starts nothing (SPEC
    section 4, as `_demand` counts it): that is said, not "starts workers when jobs wait".
    """
    found = cfg.pools.get(pool or "")
    if found is None or found.provisioner is None:
        return ""
    missing = sorted(set(labels) - set(found.provisioner.labels)) if require else []
    if missing:
        noun = "labels" if len(missing) > 1 else "label"
        carried = ", ".join(sorted(found.provisioner.labels)) or "none"
        return (
            f"pool {pool} starts no worker for it: its provisioner's workers do not carry "
            f"{noun} {', '.join(missing)} (they carry: {carried}; "
            f"[pools.{pool}.provisioner] labels)"
        )
    most = found.provisioner.max
    async with db.begin() as conn:
        counts = (await prov_q.counts(conn)).get(pool or "", {})
        health = (await prov_q.health(conn)).get(pool or "", {})
    if most == 0:
        return f"pool {pool} starts no workers: its provisioner max is 0"
    if health.get("retry_in", 0.0) > 0:
        return (
            f"pool {pool} cannot start workers ({health['last_error']}); "
            f"next try in {health['retry_in']:.0f}s"
        )
    if counts.get("starting"):
        return f"pool {pool} is starting {counts['starting']} worker(s)"
    if sum(counts.values()) >= most:
        return f"pool {pool} runs its most workers ({most})"
    return f"pool {pool} starts workers when jobs wait"
