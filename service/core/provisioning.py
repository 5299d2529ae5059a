"""How many workers a provisioned pool should start, and which ones it should drain. Pure.

The loop (service/provisioning/loop.py) hands in one pool's picture, already aggregated in SQL
(queued jobs per kind that its workers could take, free slots on the workers attached to it, its
provisioned workers), and acts on the plan. Rules (SPEC section 8):

- start one worker per waiting job's worth of slots not already covered by free or starting
  capacity, never more than `max` alive at once, and none while starts are backing off;
- drain a worker that held no lease for `idle_seconds`, and, when alive workers exceed `max`
  (a limit lowered it), the excess: idle ones first, then the least busy.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Provisioned:
    name: str
    state: str  # starting | running | draining
    live: int = 0  # live leases
    idle_for: float = 0.0  # seconds since it last held a lease (or started)


@dataclass(frozen=True, slots=True)
class PoolPicture:
    name: str
    slots: Mapping[str, int]  # per worker, by kind
    max: int
    idle_seconds: float
    queued: Mapping[str, int]  # waiting jobs per kind that a worker of this pool could take
    free: Mapping[str, int] = field(default_factory=dict)  # free slots of attached workers
    workers: Sequence[Provisioned] = ()
    backing_off: bool = False  # a start failed lately: wait before the next


@dataclass(frozen=True, slots=True)
class Plan:
    start: int = 0
    drain: tuple[str, ...] = ()
    waiting_on_backoff: bool = False  # work waits, but starts are backing off


def plan(pool: PoolPicture) -> Plan:
    """What to start and what to drain in this pool now."""
    alive = [w for w in pool.workers if w.state != "draining"]
    drain: list[str] = [
        w.name
        for w in alive
        if w.state == "running" and w.live == 0 and w.idle_for >= pool.idle_seconds
    ]
    staying = [w for w in alive if w.name not in drain]
    excess = len(staying) - max(0, pool.max)
    if excess > 0:
        # Idle first, then the least busy; a starting one (no work yet) before a running one.
        order = sorted(staying, key=lambda w: (w.live, w.state != "starting", -w.idle_for))
        drain += [w.name for w in order[:excess]]
        staying = order[excess:]
    starting = sum(1 for w in staying if w.state == "starting")
    needed = 0
    for kind, waiting in pool.queued.items():
        per_worker = pool.slots.get(kind, 0)
        if waiting <= 0 or per_worker <= 0:
            continue
        uncovered = waiting - pool.free.get(kind, 0) - starting * per_worker
        needed = max(needed, math.ceil(uncovered / per_worker))
    # `max` counts every worker alive at once: draining ones still run until they exit.
    room = max(0, pool.max - len(pool.workers))
    start = min(max(0, needed), room)
    if start and pool.backing_off:
        return Plan(start=0, drain=tuple(drain), waiting_on_backoff=True)
    return Plan(start=start, drain=tuple(drain))


def backoff_seconds(failures: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """How long to wait before the next start after `failures` failed ones in a row."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2.0 ** (failures - 1))
