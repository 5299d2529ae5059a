"""Which worker may take which job, and why a job waits or a worker gets nothing.

The one place that decides placement. Pure: the dispatcher (domain/dispatch.py) hands in the
queued jobs already in fairness order (fewest running jobs per tenant, then priority, then age;
that order is computed in SQL) and the workers with their pools, and gets back assignments.
`waiting_for` and `no_lease_reason` explain the same rules to people.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.core.states import DevicePolicy, Liveness, WorkerState


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    slots: Mapping[str, int]
    max_load: float = 0.0  # 0: no threshold
    min_memory_gb: float = 0.0
    min_disk_gb: float = 0.0


@dataclass(frozen=True, slots=True)
class HostSample:
    cpus: int = 0
    load: float = 0.0
    free_memory_gb: float = 0.0
    free_disk_gb: float = 0.0
    gpus: tuple[str, ...] = ()


@dataclass(slots=True)
class WorkerView:
    id: str
    name: str
    pool: str
    state: WorkerState
    liveness: Liveness
    attached: bool
    labels: frozenset[str]
    parallel: int  # most jobs at once, over all kinds; 0: the pool's slots decide alone
    host: HostSample | None
    used: dict[str, int] = field(default_factory=dict)  # live leases per kind
    tenants: frozenset[str] = frozenset()  # a tenant's own machine serves only these; {}: all


@dataclass(frozen=True, slots=True)
class JobWant:
    id: int
    tenant: str
    kind: str
    pool: str | None
    labels: frozenset[str]
    device_policy: DevicePolicy
    priority: int = 0

    @classmethod
    def of(cls, job: Any) -> "JobWant":  # noqa: ANN401  (a job row or record: same names)
        return cls(
            id=job.id,
            tenant=job.tenant,
            kind=job.kind,
            pool=job.pool,
            labels=frozenset(job.labels),
            device_policy=DevicePolicy(job.device_policy),
            priority=job.priority,
        )


def blocked_by(worker: WorkerView, pool: PoolSpec) -> str | None:
    """Why this worker takes no job at all right now, or None when it may take one."""
    if not worker.attached or worker.liveness is Liveness.GONE:
        return "offline"
    if worker.liveness in (Liveness.UNREACHABLE, Liveness.LOST):
        return "unreachable"
    if worker.state is WorkerState.DRAINING:
        return "draining"
    if worker.state is WorkerState.DISABLED:
        return "disabled"
    host = worker.host
    if host is not None:
        if pool.max_load > 0 and host.load > pool.max_load:
            return "load"
        if pool.min_memory_gb > 0 and host.free_memory_gb < pool.min_memory_gb:
            return "memory"
        if pool.min_disk_gb > 0 and host.free_disk_gb < pool.min_disk_gb:
            return "disk"
    return None


def free_slots(worker: WorkerView, pool: PoolSpec) -> dict[str, int]:
    """Free slots per kind: the pool's slots less live leases, capped by --parallel."""
    return room_left(pool.slots, worker.used, worker.parallel)


def room_left(slots: Mapping[str, int], used: Mapping[str, int], parallel: int) -> dict[str, int]:
    """`free_slots` from its parts (a worker's leases by kind, its --parallel)."""
    free = {kind: max(0, n - used.get(kind, 0)) for kind, n in slots.items()}
    if parallel > 0:
        room = max(0, parallel - sum(used.values()))
        free = {kind: min(n, room) for kind, n in free.items()}
    return free


def carries(worker: WorkerView, labels: frozenset[str]) -> bool:
    return labels <= worker.labels


def serves(worker: WorkerView, tenant: str) -> bool:
    """A worker minted for tenants runs only their jobs; a fleet-wide one runs anyone's."""
    return not worker.tenants or tenant in worker.tenants


def labels_matter(job: JobWant, attached: Iterable[WorkerView]) -> bool:
    """`require` always; `prefer` only while some attached worker carries the labels."""
    if job.device_policy is DevicePolicy.REQUIRE or not job.labels:
        return True
    return any(
        w.attached and (job.pool is None or w.pool == job.pool) and carries(w, job.labels)
        for w in attached
    )


def assign(
    jobs: Sequence[JobWant],
    workers: Sequence[WorkerView],
    pools: Mapping[str, PoolSpec],
    *,
    attached: Sequence[WorkerView] = (),
) -> list[tuple[JobWant, WorkerView]]:
    """Give free slots to jobs in the order given; each job to at most one worker.

    `workers` are those this server may grant to (attached here); `attached` is every worker
    attached anywhere, which decides whether a `prefer` job's labels still matter.
    """
    free: dict[str, dict[str, int]] = {}
    room: dict[str, int] = {}  # what --parallel still allows, over all kinds
    for w in workers:
        pool = pools.get(w.pool)
        if pool is not None and blocked_by(w, pool) is None:
            free[w.id] = free_slots(w, pool)
            room[w.id] = w.parallel - sum(w.used.values()) if w.parallel > 0 else 1 << 30
    everyone = list(attached) or list(workers)
    out: list[tuple[JobWant, WorkerView]] = []
    for job in jobs:
        strict = labels_matter(job, everyone)
        # The fitting worker with the most free slots of the kind first: work spreads out.
        best: WorkerView | None = None
        best_free = 0
        for w in workers:
            slots = free.get(w.id)
            if slots is None or room[w.id] <= 0 or (job.pool is not None and w.pool != job.pool):
                continue
            if not serves(w, job.tenant):
                continue
            n = min(slots.get(job.kind, 0), room[w.id])
            if n > best_free and (not strict or carries(w, job.labels)):
                best, best_free = w, n
        if best is None:
            continue
        free[best.id][job.kind] -= 1
        room[best.id] -= 1
        out.append((job, best))
    return out


def waiting_for(job: JobWant, workers: Sequence[WorkerView], pools: Mapping[str, PoolSpec]) -> str:
    """One sentence saying what a queued job waits for, e.g. "no attached worker has label x"."""
    attached = [w for w in workers if w.attached and w.liveness is not Liveness.GONE]
    where = f"pool {job.pool}" if job.pool else "any pool"
    if job.pool is not None and job.pool not in pools:
        return f"pool {job.pool} is not configured"
    kinds = [p for p in pools.values() if job.kind in p.slots and (job.pool in (None, p.name))]
    if not kinds:
        scope = [pools[job.pool]] if job.pool else list(pools.values())
        return no_slots_of_kind(job.kind, scope, pool=job.pool)
    in_pool = [w for w in attached if job.pool is None or w.pool == job.pool]
    # A worker of a pool this server has no config for cannot take the job: leave it out.
    in_pool = [w for w in in_pool if w.pool in pools and job.kind in pools[w.pool].slots]
    if not in_pool:
        return f"no worker of {where} with {job.kind} slots is attached"
    in_pool = [w for w in in_pool if serves(w, job.tenant)]
    if not in_pool:
        return f"no attached worker of {where} serves tenant {job.tenant}"
    if labels_matter(job, attached):
        carrying = [w for w in in_pool if carries(w, job.labels)]
        if not carrying:
            missing = sorted(job.labels - _common(in_pool)) or sorted(job.labels)
            label = ", ".join(missing)
            noun = "labels" if len(missing) > 1 else "label"
            return f"no attached worker of {where} has {noun} {label}"
        in_pool = carrying
    reasons = {w.id: blocked_by(w, pools[w.pool]) for w in in_pool}
    open_ = [w for w in in_pool if reasons[w.id] is None]
    if not open_:
        return _all_blocked(where, [r for r in reasons.values() if r], pools, job.pool)
    total = sum(pools[w.pool].slots.get(job.kind, 0) for w in open_)
    if all(free_slots(w, pools[w.pool]).get(job.kind, 0) == 0 for w in open_):
        return f"all {total} {job.kind} slots of {where} are busy"
    return "its turn: free slots go to tenants with fewer running jobs, then priority, then age"


def no_slots_of_kind(kind: str, scope: Sequence[PoolSpec], *, pool: str | None) -> str:
    """Why no slot of `kind` can ever take a job, naming the kinds there are."""
    if pool is not None:
        kinds = ", ".join(sorted(k for p in scope for k in p.slots)) or "none"
        return f"pool {pool} has no slots of kind {kind!r} (its kinds: {kinds})"
    offered = "; ".join(
        f"{p.name}: {', '.join(sorted(p.slots))}" for p in sorted(scope, key=lambda p: p.name)
    )
    return f"no pool has slots of kind {kind!r} (kinds by pool: {offered or 'no pools'})"


def _common(workers: Sequence[WorkerView]) -> frozenset[str]:
    labels: frozenset[str] = frozenset()
    for w in workers:
        labels |= w.labels
    return labels


def _all_blocked(
    where: str, reasons: list[str], pools: Mapping[str, PoolSpec], pool: str | None
) -> str:
    words = {
        "load": "over max_load",
        "memory": "under min_memory_gb",
        "disk": "under min_disk_gb",
        "draining": "draining",
        "disabled": "disabled",
        "unreachable": "unreachable",
        "offline": "offline",
    }
    if len(set(reasons)) == 1:
        reason = reasons[0]
        limit = ""
        if pool is not None and reason == "load":
            limit = f" ({pools[pool].max_load})"
        return f"{where} is {words[reason]}{limit} on every worker"
    seen = ", ".join(sorted({words[r] for r in reasons}))
    return f"every worker of {where} is unavailable ({seen})"


def no_lease_reason(worker: WorkerView, pool: PoolSpec | None, has_waiting_job: bool) -> str:
    """Why a worker holds no new lease: a state or threshold, `slots`, or `nothing` to run."""
    if pool is None:
        return "pool"
    reason = blocked_by(worker, pool)
    if reason is not None:
        return reason
    if not any(free_slots(worker, pool).values()):
        return "slots"
    return "nothing" if not has_waiting_job else "-"
