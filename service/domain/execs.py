"""Who may exec into which job (`berth job exec`), and the audit of each session.

A job another tenant's caller cannot see is "no job" (404), as everywhere. Then the pool the
job runs in decides ([pools.P] exec): "operator" lets operators and admins of the job's tenant
in, "member" its members too, "off" nobody, admins included. Only a running job has a process
to stand beside; anything else is refused with its state.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.auth.callers import Caller, Role
from service.core.errors import Conflict, Forbidden
from service.core.states import JobState
from service.db.engine import Database
from service.db.queries import leases as leases_q
from service.db.records import JobRecord
from service.domain import audit, jobs

ALLOWED: dict[str, frozenset[Role]] = {
    "operator": frozenset({Role.OPERATOR, Role.ADMIN}),
    "member": frozenset({Role.MEMBER, Role.OPERATOR, Role.ADMIN}),
    "off": frozenset(),
}


@dataclass(frozen=True, slots=True)
class Target:
    """Where an admitted exec runs: beside this job's live lease, on that worker."""

    job: JobRecord
    epoch: int
    worker_id: str
    pool: str


async def admit(
    db: Database, caller: Caller, job_id: int, policy_of: Callable[[str], str]
) -> Target:
    """The job's live lease if `caller` may exec into it; else the refusal, with its reason.

    `policy_of(pool)`: that pool's `exec` setting.
    """
    job = await jobs.get(db, caller, job_id)  # another tenant's job: NotFound
    if job.state != JobState.RUNNING:
        raise Conflict(f"job {job_id} is {job.state}: exec runs a command beside a running job")
    async with db.begin() as conn:
        lease = await leases_q.live_of_job(conn, job_id)
    if lease is None:
        raise Conflict(f"job {job_id} has no live lease: exec runs beside a running job")
    epoch, worker_id, pool = lease
    policy = policy_of(pool)
    if caller.role not in ALLOWED.get(policy, frozenset()):
        if policy == "off":
            raise Forbidden(f'exec is off in pool {pool} ([pools.{pool}] exec = "off")')
        who = "operators and admins" if policy == "operator" else "members"
        raise Forbidden(
            f"exec into pool {pool}'s jobs is for {who} of the job's tenant "
            f'([pools.{pool}] exec = "{policy}"); you are a {caller.role}'
        )
    return Target(job, epoch, worker_id, pool)


async def opened(
    db: Database,
    caller: Caller,
    target: Target,
    command: Sequence[str],
    *,
    tty: bool,
    session: int,
    request_id: str = "",
) -> None:
    """Audit: who opened which exec into which job, and the command (before it runs)."""
    async with db.begin() as conn:
        await audit.record(
            conn,
            caller,
            "job.exec",
            str(target.job.id),
            tenant=target.job.tenant,
            request_id=request_id,
            command=list(command) or ["(the job's shell)"],
            tty=tty,
            session=session,
            attempt=target.epoch,
        )


async def ended(
    db: Database,
    caller: Caller,
    target: Target,
    *,
    session: int,
    exit_code: int | None,
    error: str,
    request_id: str = "",
) -> None:
    """Audit: how the exec ended (its exit code, or why it did not run or was cut)."""
    async with db.begin() as conn:
        await audit.record(
            conn,
            caller,
            "job.exec_ended",
            str(target.job.id),
            tenant=target.job.tenant,
            request_id=request_id,
            session=session,
            exit_code=exit_code,
            error=error,
        )
