"""Jobs: submit (one or a batch), read, cancel, output. Tenant isolation on every call."""

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth.callers import Caller
from service.cas.base import Store, one_chunk
from service.config import Config
from service.core import placement, resources
from service.core.errors import Conflict, Invalid, NotFound, OverBound
from service.core.placement import PoolSpec
from service.core.resources import Resources
from service.core.states import DevicePolicy, JobState
from service.db.driver import Conn
from service.db.engine import Database
from service.db.queries import artifacts as artifacts_q
from service.db.queries import jobs as jobs_q
from service.db.queries import leases as leases_q
from service.db.queries import workers as workers_q
from service.db.queries.artifacts import Ref
from service.db.records import JobRecord, OutputChunk
from service.domain import approvals, audit, provisioning, secrets
from service.domain import output as output_d
from service.domain.artifacts import references, server_store
from service.domain.fleet import worker_views
from service.domain.queued import QueuedSeen
from service.domain.tokens import check_name, tenant_to_write

ENV_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
MAX_BATCH = 5000  # jobs per submit (declared on the API's body)


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
    inputs: Sequence[Mapping[str, str]] = ()  # {name, sha256, kind}: blobs the tenant holds
    repo: str = ""  # URL[@REV]
    # Resources (SPEC section 4): None takes the pool's default (0 without a pool).
    cpus: float | None = None
    memory_mb: int | None = None
    gpus: int | None = None


def validate(spec: JobSpec, caller: Caller, pools: Mapping[str, PoolSpec]) -> dict[str, Any]:
    """Check a spec against the config and the caller; return the row to insert.

    Bounds (types, lengths, ranges, no NUL, the input names and kinds) are declared once, on
    the API's body (api/routes/jobs.py JobBody), and checked as it decodes; here are only the
    rules that need the pools, the caller, or more than one field.
    """
    if bool(spec.command) == bool(spec.python):
        raise Invalid(
            "give exactly one of command (a non-empty list) or python (source)", field="command"
        )
    # A pool is a thing that exists or not (404); kinds come and go with `pools.P.slots.KIND`
    # limits, so a kind no pool offers now is a state of the fleet (409), not a bad request.
    if spec.pool is not None and spec.pool not in pools:
        raise NotFound(
            f"unknown pool {spec.pool!r}; configured: {', '.join(sorted(pools))}", field="pool"
        )
    scope = [pools[spec.pool]] if spec.pool else list(pools.values())
    if not any(spec.kind in p.slots for p in scope):
        raise Conflict(placement.no_slots_of_kind(spec.kind, scope, pool=spec.pool), field="kind")
    for where, names in (("env", spec.env), ("secrets", spec.secrets)):
        for key in names:
            if not ENV_KEY.match(key):  # named in the answer: a pattern on keys could not say which
                raise Invalid(f"{key!r} is not a valid environment variable name", field=where)
    inputs = [dict(i) for i in spec.inputs]
    if len({i["name"] for i in inputs}) != len(inputs):
        raise Invalid(
            "two inputs share a name: each lands in the job's folder by its name", field="inputs"
        )
    request = _request(spec, pools)
    tenant = tenant_to_write(caller, spec.tenant, doing="submit")
    return {
        "tenant": tenant,
        "kind": spec.kind,
        "pool": spec.pool,
        "labels": sorted(set(spec.labels)),
        "device_policy": str(DevicePolicy(spec.device_policy)),
        "command": list(spec.command),
        "python": spec.python,
        "python_sha256": "",
        "env": dict(spec.env),
        "inputs": inputs,
        "repo": spec.repo,
        "secrets": dict(spec.secrets),
        "timeout_seconds": spec.timeout_seconds,
        "max_attempts": spec.max_attempts,
        "priority": spec.priority,
        **request.as_dict(),
        "created_by": str(caller),
    }


def _request(spec: JobSpec, pools: Mapping[str, PoolSpec]) -> Resources:
    """What the job asks for: its own values, the rest from its pool's defaults (none: 0)."""
    default = pools[spec.pool].default if spec.pool is not None else Resources()
    field = "cpus"
    try:
        cpus = resources.check_cpus(default.cpus if spec.cpus is None else spec.cpus)
        field = "gpus"
        gpus = resources.check_gpus(default.gpus if spec.gpus is None else spec.gpus)
        field = "memory_mb"
        memory = resources.parse_size(
            default.memory_mb if spec.memory_mb is None else spec.memory_mb
        )
    except resources.BadSize as exc:
        raise Invalid(str(exc), field=field) from None
    return Resources(cpus, memory, gpus)


async def submit(
    db: Database,
    caller: Caller,
    specs: Sequence[JobSpec],
    pools: Mapping[str, PoolSpec],
    *,
    in_force: Config,
    request_id: str = "",
    cas: server_store.ServerStore | None = None,
    queued: QueuedSeen | None = None,
) -> list[JobRecord]:
    """Queue jobs (all or none); every server's dispatcher hears of them on commit.

    Inputs must be blobs the job's tenant holds (404 otherwise: knowing a hash is not enough);
    each becomes a reference of the job. Python source goes into the store and travels by hash.
    A batch that would take a tenant's queued jobs past its `max_queued` (from `in_force`,
    berth.toml with the limits) is refused whole, naming the key; nothing is stored. `queued` (this
    server's memory of the tenants' queues) spares the count of a tenant far below its bound.
    """
    if not specs:
        raise Invalid("no jobs given")
    rows = [validate(s, caller, pools) for s in specs]
    wanted: dict[str, set[str]] = {}  # tenant -> secret names, so a batch checks once per tenant
    for row in rows:
        wanted.setdefault(row["tenant"], set()).update(row["secrets"].values())
    for tenant, names in wanted.items():
        if names:
            await secrets.check_exist(db, tenant=tenant, names=names)
    if any(r["inputs"] for r in rows) and cas is None:
        raise Invalid("inputs need the artifact store, which this server does not offer")
    bounds = {tenant: in_force.tenant_bounds(tenant) for tenant in wanted}
    code = _code_by_hash(rows) if cas is not None else {}
    max_queued = {t: b.max_queued for t, b in bounds.items()}
    adding = dict(Counter(row["tenant"] for row in rows))
    uncounted = queued.uncounted(adding, max_queued) if queued else frozenset()

    async def insert(conn: Conn) -> list[JobRecord]:
        created, over, counts = await jobs_q.submit_many(
            conn,
            rows,
            max_queued=max_queued,
            caller=str(caller),
            request_id=request_id,
            on_behalf=caller.on_behalf,
            uncounted=uncounted,
        )
        if over:
            raise _over(over[0], bounds[over[0].tenant].key("max_queued"))
        if queued:
            queued.submitted(adding, ((c.tenant, c.queued) for c in counts))
        return created

    if cas is None or not (code or any(r["inputs"] for r in rows)):
        # Nothing to reference in the store: the hot path, straight on the driver.
        async with db.driver() as hot:
            return await insert(hot)
    async with db.begin() as conn:
        created = await insert(conn)
        if code:
            # Stored only once the jobs are in: a refused submit leaves nothing in the
            # store. Their references commit with the jobs, under the blobs' shared locks
            # (taken before the put), so the collector cannot take one before the commit.
            await artifacts_q.lock_shared(conn, *code)
            for sha, source in code.items():
                await cas.store.put(one_chunk(source), sha256=sha)
        await _reference(
            conn, created, cas, {sha: len(b) for sha, b in code.items()}, by=str(caller)
        )
    return created


def _over(over: jobs_q.QueueCount, key: str) -> OverBound:
    """The refusal of a submit past a tenant's bound on queued jobs, naming the bound's key."""
    if over.queued > over.bound:
        now = f"has over {over.bound} queued jobs"
    else:
        now = f"has {over.queued} queued jobs"
    return OverBound(
        f"tenant {over.tenant} {now}; {over.adding} more would pass its {key} = {over.bound} "
        "(nothing was queued; submit again once its queue drains, or raise the bound)"
    )


def _code_by_hash(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Python source travels by hash (SPEC): each row keeps the hash; the sources, by hash.

    The distinct sources go into the store once the jobs are in.
    """
    code: dict[str, bytes] = {}
    for row in rows:
        if source := row["python"]:
            data = source.encode()
            sha = hashlib.sha256(data).hexdigest()
            code[sha] = data
            row["python_sha256"], row["python"] = sha, ""
    return code


async def _reference(
    conn: AsyncConnection,
    created: list[JobRecord],
    cas: server_store.ServerStore,
    sizes: Mapping[str, int],
    *,
    by: str,
) -> None:
    """The jobs' inputs (which their tenants must hold) and code, referenced for them."""
    await references.reference_held(
        conn,
        [
            references.Named(job.tenant, item["sha256"], "input", job.id)
            for job in created
            for item in job.inputs
        ],
        by=by,
        gc_days=cas.gc_days,
    )
    await references.reference(
        conn,
        [
            Ref(job.tenant, job.python_sha256, sizes[job.python_sha256], "code", job.id, by)
            for job in created
            if job.python_sha256
        ],
    )


async def get(db: Database, caller: Caller, job_id: int) -> JobRecord:
    async with db.begin() as conn:
        job = await jobs_q.get(conn, job_id, tenants=caller.tenant_filter())
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


async def waiting_for(
    db: Database, job: JobRecord, pools: Mapping[str, PoolSpec], cfg: Config | None = None
) -> str:
    """What a queued job waits for, in words; a running one, the approval it asked for, if any.

    With the config in force, a job of a provisioned pool also hears what its provisioner does
    about it (starting workers, backing off after failed starts, held at max).
    """
    if job.state != JobState.QUEUED:
        return await approvals.waiting(db, job)
    want = placement.JobWant.of(job)
    quota = cfg.quotas().of(job.tenant) if cfg is not None else placement.Quota()
    async with db.begin() as conn:
        workers = await workers_q.list_all(conn)
        used = await leases_q.live_counts(conn, [w.id for w in workers])
        reserved = await leases_q.reserved(conn, [w.id for w in workers])
        running, gpus = (
            (await leases_q.usage_of_tenants(conn, [job.tenant]))[job.tenant] if quota else (0, 0)
        )
    views = worker_views(workers, used, reserved)
    held = placement.over_quota(want.request, job.tenant, running=running, gpus=gpus, quota=quota)
    reason = placement.waiting_for(want, views, pools, quota=held)
    note = (
        await provisioning.note(
            db,
            cfg,
            job.pool,
            labels=job.labels,
            require=job.device_policy == DevicePolicy.REQUIRE,
        )
        if cfg is not None
        else ""
    )
    return f"{reason}; {note}" if note else reason


async def list_visible(
    db: Database,
    caller: Caller,
    *,
    state: str | None,
    tenant: str | None,
    limit: int,
    pool: str | None = None,
    worker: str | None = None,
    creator: str | None = None,
) -> list[JobRecord]:
    """The caller's jobs, newest first, filtered by any of state, tenant, pool, worker, creator.

    The API checks `state` and `limit` as they enter; they are checked here again for the
    other callers (the UI's job list).
    """
    if state is not None and state not in {str(s) for s in JobState}:
        raise Invalid(
            f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}",
            field="state",
        )
    if not 1 <= limit <= 10000:
        raise Invalid("limit must be between 1 and 10000", field="limit")
    if tenant is not None:
        check_name(tenant, "tenant")
    async with db.begin() as conn:
        return await jobs_q.list_visible(
            conn,
            tenants=caller.tenant_filter(),
            state=state,
            tenant=tenant,
            limit=limit,
            pool=pool,
            worker=worker,
            creator=creator,
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
    db: Database, caller: Caller, job_id: int, *, after: int, store: Store | None = None
) -> tuple[JobRecord, list[OutputChunk]]:
    """The job and its output after id `after`.

    Older output comes from the store, the tail from Postgres (domain/output.py).
    """
    async with db.begin() as conn:
        job = await jobs_q.get(conn, job_id, tenants=caller.tenant_filter())
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job, await output_d.read(db, store, job_id, after=after)


async def attempts(db: Database, caller: Caller, job_id: int) -> list[dict[str, Any]]:
    """The job's leases, oldest first (a forgotten worker's go with its row)."""
    async with db.begin() as conn:
        if await jobs_q.get(conn, job_id, tenants=caller.tenant_filter()) is None:
            raise NotFound(f"no job {job_id}")
        return await leases_q.of_job(conn, job_id)
