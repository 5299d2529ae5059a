"""Jobs: submit (one or a batch), read, cancel, output. Tenant isolation on every call."""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.auth.callers import Caller
from service.config import Config
from service.core import placement
from service.core.errors import Forbidden, Invalid, NotFound
from service.core.placement import PoolSpec
from service.core.states import DevicePolicy, JobState
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import leases as leases_q
from service.db.queries import workers as workers_q
from service.db.records import JobRecord, OutputChunk
from service.domain import audit, provisioning, secrets
from service.domain.fleet import worker_views
from service.domain.tokens import DEFAULT_TENANT, check_name

ENV_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
MAX_BATCH = 5000


@dataclass(frozen=True, slots=True)
class JobSpec:
    command: Sequence[str] = ()
    python: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    kind: str = "default"
    pool: str | None = None
    labels: Sequence[str] = ()
    device_policy: str = "require"
    timeout_seconds: float = 0.0
    max_attempts: int = 3
    priority: int = 0
    tenant: str | None = None
    secrets: Mapping[str, str] = field(default_factory=dict)  # variable -> secret name


def _tenant_for(caller: Caller, wanted: str | None) -> str:
    if wanted:
        check_name(wanted, "tenant")
        if not caller.sees(wanted):
            raise Forbidden(f"you may not submit to tenant {wanted!r}")
        return wanted
    if caller.all_tenants:
        return DEFAULT_TENANT
    if len(caller.tenants) == 1:
        return next(iter(caller.tenants))
    raise Invalid('say which tenant: you hold several (--tenant / "tenant")')


def validate(spec: JobSpec, caller: Caller, pools: Mapping[str, PoolSpec]) -> dict[str, Any]:
    """Check a spec against the config and the caller; return the row to insert."""
    if bool(spec.command) == bool(spec.python):
        raise Invalid("give exactly one of command (a non-empty list) or python (source)")
    if any(not isinstance(a, str) for a in spec.command):
        raise Invalid("command must be a list of strings")
    try:
        policy = DevicePolicy(spec.device_policy)
    except ValueError:
        raise Invalid("device_policy must be require or prefer") from None
    if spec.pool is not None and spec.pool not in pools:
        raise Invalid(f"unknown pool {spec.pool!r}; configured: {', '.join(sorted(pools))}")
    scope = [pools[spec.pool]] if spec.pool else list(pools.values())
    if not any(spec.kind in p.slots for p in scope):
        where = f"pool {spec.pool!r}" if spec.pool else "any pool"
        raise Invalid(f"{where} has no slots of kind {spec.kind!r}")
    if spec.timeout_seconds < 0:
        raise Invalid("timeout_seconds must be >= 0 (0: no timeout)")
    if not 1 <= spec.max_attempts <= 100:
        raise Invalid("max_attempts must be between 1 and 100")
    for key in list(spec.env) + list(spec.secrets):
        if not ENV_KEY.match(key):
            raise Invalid(f"{key!r} is not a valid environment variable name")
    for label in spec.labels:
        if not label or len(label) > 256 or "," in label:
            raise Invalid(f"label {label!r} must be 1-256 characters without commas")
    tenant = _tenant_for(caller, spec.tenant)
    return {
        "tenant": tenant,
        "kind": spec.kind,
        "pool": spec.pool,
        "labels": sorted(set(spec.labels)),
        "device_policy": str(policy),
        "command": list(spec.command),
        "python": spec.python,
        "env": dict(spec.env),
        "secrets": dict(spec.secrets),
        "timeout_seconds": spec.timeout_seconds,
        "max_attempts": spec.max_attempts,
        "priority": spec.priority,
        "created_by": str(caller),
    }


async def submit(
    db: Database,
    caller: Caller,
    specs: Sequence[JobSpec],
    pools: Mapping[str, PoolSpec],
    *,
    request_id: str = "",
) -> list[JobRecord]:
    """Queue jobs (all or none); every server's dispatcher hears of them on commit."""
    if not specs:
        raise Invalid("no jobs given")
    if len(specs) > MAX_BATCH:
        raise Invalid(f"at most {MAX_BATCH} jobs per request")
    rows = [validate(s, caller, pools) for s in specs]
    wanted: dict[str, set[str]] = {}  # tenant -> secret names, so a batch checks once per tenant
    for row in rows:
        wanted.setdefault(row["tenant"], set()).update(row["secrets"].values())
    for tenant, names in wanted.items():
        if names:
            await secrets.check_exist(db, tenant=tenant, names=names)
    async with db.begin() as conn:
        return await jobs_q.submit_many(conn, rows, caller=str(caller), request_id=request_id)


async def get(db: Database, caller: Caller, job_id: int) -> JobRecord:
    async with db.begin() as conn:
        job = await jobs_q.get(conn, job_id, tenants=caller.tenant_filter())
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


async def waiting_for(
    db: Database, job: JobRecord, pools: Mapping[str, PoolSpec], cfg: Config | None = None
) -> str:
    """What a queued job waits for, in words; "" for a job that is not queued.

    With the config in force, a job of a provisioned pool also hears what its provisioner does
    about it (starting workers, backing off after failed starts, held at max).
    """
    if job.state != JobState.QUEUED:
        return ""
    async with db.begin() as conn:
        workers = await workers_q.list_all(conn)
        used = await leases_q.live_counts(conn, [w.id for w in workers])
    views = worker_views(workers, used)
    reason = placement.waiting_for(placement.JobWant.of(job), views, pools)
    note = await provisioning.note(db, cfg, job.pool) if cfg is not None else ""
    return f"{reason}; {note}" if note else reason


async def list_visible(
    db: Database, caller: Caller, *, state: str | None, tenant: str | None, limit: int
) -> list[JobRecord]:
    if state is not None and state not in {str(s) for s in JobState}:
        raise Invalid(f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}")
    if not 1 <= limit <= 10000:
        raise Invalid("limit must be between 1 and 10000")
    if tenant is not None:
        check_name(tenant, "tenant")
    async with db.begin() as conn:
        return await jobs_q.list_visible(
            conn, tenants=caller.tenant_filter(), state=state, tenant=tenant, limit=limit
        )


async def cancel(db: Database, caller: Caller, job_id: int, *, request_id: str = "") -> JobRecord:
    """Cancel a job; a running copy is killed by its worker (now, or when it comes back)."""
    async with db.begin() as conn:
        job = await jobs_q.get(conn, job_id, tenants=caller.tenant_filter())
        if job is None:
            raise NotFound(f"no job {job_id}")
        result = await jobs_q.cancel(conn, job_id)
        if result is not None:
            before, epoch = result
            if before != JobState.QUEUED and job.worker:
                await workers_q.notify(
                    conn, {"op": "cancel", "worker": job.worker, "job": job_id, "epoch": epoch}
                )
            await audit.record(
                conn, caller, "job.cancelled", str(job_id), tenant=job.tenant, request_id=request_id
            )
        updated = await jobs_q.get(conn, job_id, tenants=None)
    assert updated is not None
    return updated


async def output(
    db: Database, caller: Caller, job_id: int, *, after: int
) -> tuple[JobRecord, list[OutputChunk]]:
    async with db.begin() as conn:
        job = await jobs_q.get(conn, job_id, tenants=caller.tenant_filter())
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job, await jobs_q.output_after(conn, job_id, after=after)
