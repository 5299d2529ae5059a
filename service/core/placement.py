"""Which worker may take which job, and why a job waits or a worker gets nothing.

The one place that decides placement. Pure: the dispatcher (domain/dispatch.py) hands in the
queued jobs already in fairness order (fewest running jobs per tenant, then priority, then age;
that order is computed in SQL) and the workers with their pools, and gets back assignments.
`waiting_for` and `no_lease_reason` explain the same rules to people.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.core.resources import NOTHING, Resources, shown_cpus, shown_memory
from service.core.states import DevicePolicy, Liveness, WorkerState


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    slots: Mapping[str, int]
    max_load: float = 0.0  # 0: no threshold
    min_memory_gb: float = 0.0
    min_disk_gb: float = 0.0
    # What a job of this pool asks for when it says nothing (SPEC section 4, "Resources").
    default: Resources = NOTHING


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
    capacity: Resources = NOTHING  # what it declared (berth worker --cpus --memory --gpus)
    reserved: Resources = NOTHING  # what its live leases asked for

    @property
    def left(self) -> Resources:
        return self.capacity - self.reserved


@dataclass(frozen=True, slots=True)
class JobWant:
    id: int
    tenant: str
    kind: str
    pool: str | None
    labels: frozenset[str]
    device_policy: DevicePolicy
    priority: int = 0
    request: Resources = NOTHING

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
            # (most jobs ask for nothing: no object each on the claim's path)
            request=(
                Resources(job.cpus, job.memory_mb, job.gpus)
                if job.cpus or job.memory_mb or job.gpus
                else NOTHING
            ),
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
    left: dict[str, Resources] = {}  # capacity less what its leases (and this pass) reserve
    for w in workers:
        pool = pools.get(w.pool)
        if pool is not None and blocked_by(w, pool) is None:
            free[w.id] = free_slots(w, pool)
            room[w.id] = w.parallel - sum(w.used.values()) if w.parallel > 0 else 1 << 30
            left[w.id] = w.left
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
                # A job that asks for nothing skips the resource check: placement as before.
                if job.request and left[w.id].short_of(job.request) is not None:
                    continue
                best, best_free = w, n
        if best is None:
            continue
        free[best.id][job.kind] -= 1
        room[best.id] -= 1
        if job.request:
            left[best.id] = left[best.id] - job.request
        out.append((job, best))
    return out


def waiting_for(
    job: JobWant,
    workers: Sequence[WorkerView],
    pools: Mapping[str, PoolSpec],
    *,
    quota: str = "",
) -> str:
    """One sentence saying what a queued job waits for, e.g. "no attached worker has label x".

    `quota`: why its tenant's quota holds it back now (`over_quota`), or "".
    """
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
    if quota:
        return quota
    if job.request:
        able = [w for w in open_ if w.capacity.short_of(job.request) is None]
        if not able:
            short = open_[0].capacity.short_of(job.request) or "cpus"
            return f"no worker of {where} has {_amount(job.request, short)}"
        open_ = able
    total = sum(pools[w.pool].slots.get(job.kind, 0) for w in open_)
    if all(free_slots(w, pools[w.pool]).get(job.kind, 0) == 0 for w in open_):
        return f"all {total} {job.kind} slots of {where} are busy"
    return _reserved(job, where, open_, pools) or (
        "its turn: free slots go to tenants with fewer running jobs, then priority, then age"
    )


def _reserved(
    job: JobWant, where: str, open_: Sequence[WorkerView], pools: Mapping[str, PoolSpec]
) -> str:
    """Why a job waits while slots are free: none of them has what it asks left; else ""."""
    if not job.request:
        return ""
    with_slot = [w for w in open_ if free_slots(w, pools[w.pool]).get(job.kind, 0) > 0]
    if not with_slot or any(w.left.short_of(job.request) is None for w in with_slot):
        return ""
    short = with_slot[0].left.short_of(job.request) or "cpus"
    return f"no worker of {where} has {_amount(job.request, short, free=True)}"


def _amount(request: Resources, resource: str, *, free: bool = False) -> str:
    """What `request` needs of `resource`: "2 free GPUs", "4 CPUs", "2 GiB of free memory"."""
    word = "free " if free else ""
    if resource == "gpus":
        return f"{request.gpus} {word}GPU{'s' if request.gpus != 1 else ''}"
    if resource == "memory":
        return f"{shown_memory(request.memory_mb)} of {word}memory"
    return f"{shown_cpus(request.cpus)} {word}CPU{'s' if request.cpus != 1 else ''}"


def over_quota(request: Resources, tenant: str, *, running: int, gpus: int, quota: "Quota") -> str:
    """Why `tenant`'s quota holds a job asking `request` back now, or "" when it does not."""
    if quota.max_running and running >= quota.max_running:
        return (
            f"tenant {tenant} runs {running} jobs, its quota {quota.running_key} = "
            f"{quota.max_running}"
        )
    if quota.max_gpus and request.gpus and gpus + request.gpus > quota.max_gpus:
        return (
            f"tenant {tenant} holds {gpus} GPUs and {request.gpus} more would pass its quota "
            f"{quota.gpus_key} = {quota.max_gpus}"
        )
    return ""


@dataclass(frozen=True, slots=True)
class Quota:
    """One tenant's quotas in force (0: none), with the keys that set them (for people)."""

    max_running: int = 0
    max_gpus: int = 0
    running_key: str = ""
    gpus_key: str = ""

    def __bool__(self) -> bool:
        return bool(self.max_running or self.max_gpus)


@dataclass(frozen=True, slots=True)
class Quotas:
    """Every tenant's quotas: [tenants.default]'s, and those of tenants with their own."""

    default: Quota = field(default_factory=Quota)
    tenants: Mapping[str, Quota] = field(default_factory=dict)

    def of(self, tenant: str) -> Quota:
        return self.tenants.get(tenant, self.default)

    def __bool__(self) -> bool:
        return bool(self.default) or any(self.tenants.values())


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


def no_lease_reason(
    worker: WorkerView,
    pool: PoolSpec | None,
    has_waiting_job: bool,
    *,
    waiting: Sequence[JobWant] = (),
    held_back: frozenset[str] = frozenset(),
) -> str:
    """Why a worker holds no new lease: a state or threshold, `slots`, or `nothing` to run.

    With the jobs that could run on it (`waiting`, its kinds and labels) and the tenants whose
    quota holds them back now (`held_back`): `quota` when every such job's tenant is at its
    quota, `cpus_reserved` / `memory_reserved` / `gpus_reserved` when none fits what its leases
    leave of its capacity.
    """
    if pool is None:
        return "pool"
    reason = blocked_by(worker, pool)
    if reason is not None:
        return reason
    if not any(free_slots(worker, pool).values()):
        return "slots"
    if not has_waiting_job:
        return "nothing"
    if waiting:
        free = [j for j in waiting if j.tenant not in held_back]
        if not free:
            return "quota"
        shorts = [worker.left.short_of(j.request) if j.request else None for j in free]
        if all(s is not None for s in shorts):
            return f"{shorts[0]}_reserved"
    return "-"
