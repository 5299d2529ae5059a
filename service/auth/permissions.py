"""What each role may do. The table is the policy: read it, do not re-derive it in handlers.

Every route declares one Perm (api/guards.py enforces it; a test fails on a route without one).
"""

import enum
from collections.abc import Mapping
from typing import Final

from service.auth.callers import Caller, Role


class Perm(enum.StrEnum):
    JOBS_READ = "jobs.read"
    JOBS_WRITE = "jobs.write"
    # A command beside a running job (`berth job exec`); the job's pool narrows it further
    # ([pools.P] exec, domain/execs.py).
    JOBS_EXEC = "jobs.exec"
    FLEET_READ = "fleet.read"
    FLEET_WRITE = "fleet.write"  # pools, workers, limits
    TOKENS = "tokens"
    SECRETS = "secrets"
    AUDIT = "audit"
    METRICS = "metrics"
    WORKER_PROTOCOL = "worker.protocol"


GRANTS: Final[Mapping[Role, frozenset[Perm]]] = {
    Role.ADMIN: frozenset(Perm) - {Perm.WORKER_PROTOCOL},
    Role.OPERATOR: frozenset(
        {
            Perm.FLEET_READ,
            Perm.FLEET_WRITE,
            Perm.TOKENS,
            Perm.SECRETS,
            Perm.JOBS_READ,
            Perm.JOBS_EXEC,
            Perm.METRICS,
        }
    ),
    Role.MEMBER: frozenset({Perm.JOBS_READ, Perm.JOBS_WRITE, Perm.JOBS_EXEC, Perm.FLEET_READ}),
    Role.VIEWER: frozenset({Perm.JOBS_READ, Perm.FLEET_READ}),
    Role.WORKER: frozenset({Perm.WORKER_PROTOCOL}),
    Role.METRICS: frozenset({Perm.METRICS}),
}


def allowed(caller: Caller, perm: Perm) -> bool:
    """The caller's role grants `perm`. Tenant checks are separate: see Caller.sees."""
    return perm in GRANTS[caller.role]
