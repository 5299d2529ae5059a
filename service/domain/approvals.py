"""Approvals: a job asks a person's yes and blocks; another member of its tenant answers.

A job asks (`request_approval`, relayed by its worker as `job:<id>`) while its lease is live;
the request is tied to that lease. Who may answer is fixed when it is asked, from `[pools.P]
approvals` of the pool whose worker holds the lease: "four-eyes" (the default) refuses the job's
creator (the person behind the jobs that submitted it, when a job submitted it), "any-member"
takes any member of the job's tenant. A job never answers. A request is denied as `timed_out`
at its deadline (`[pools.P] approval_timeout_seconds`) and `closed` when its lease ends first;
the server enforces both from the table (`settle`): the leader every pass, and every read or
answer of a request first, in its own transaction, so a restart loses nothing. Every act is
audited, and so is a refused answer.
"""

from collections.abc import Mapping
from enum import StrEnum

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth.callers import Caller, Kind
from service.config import Pool
from service.core.errors import Conflict, Forbidden, Invalid, NotFound
from service.core.states import JobState
from service.db.engine import Database
from service.db.queries import approvals as approvals_q
from service.db.queries import jobs as jobs_q
from service.db.records import ApprovalRecord, JobRecord
from service.domain import audit
from service.domain.tokens import SYSTEM

log = structlog.get_logger(__name__)

MAX_TITLE = 200
MAX_DETAILS = 16 * 1024


class State(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"  # no answer before the deadline: a denial
    CLOSED = "closed"  # the lease ended before an answer


class Policy(StrEnum):
    FOUR_EYES = "four-eyes"
    ANY_MEMBER = "any-member"


async def ask(
    db: Database,
    caller: Caller,
    pools: Mapping[str, Pool],
    *,
    title: str,
    details: str = "",
    request_id: str = "",
) -> ApprovalRecord:
    """A job's request, pending until answered, timed out or its lease ends."""
    if caller.kind is not Kind.JOB:
        raise Forbidden("only a job asks for approval (request_approval, inside the job)")
    title = " ".join(title.split())
    if not title or len(title) > MAX_TITLE:
        raise Invalid(f"an approval's title is 1-{MAX_TITLE} characters")
    if len(details) > MAX_DETAILS:
        raise Invalid(f"an approval's details are at most {MAX_DETAILS} characters")
    job_id = int(caller.name)
    async with db.begin() as conn:
        job = await jobs_q.get(conn, job_id, tenants=caller.tenant_filter())
        lease = await approvals_q.live_lease(conn, job_id)
        if job is None or lease is None:
            raise Conflict(f"job {job_id} holds no live lease: it cannot ask for approval")
        epoch, pool_name = lease
        pool = pools.get(pool_name) or Pool()
        created = await approvals_q.insert(
            conn,
            {
                "job_id": job.id,
                "epoch": epoch,
                "tenant": job.tenant,
                "pool": pool_name,
                "title": title,
                "details": details,
                "policy": pool.approvals,
                "job_creator": await approvals_q.root_creator(conn, job.id),
            },
            timeout=pool.approval_timeout_seconds,
        )
        await audit.record(
            conn,
            caller,
            "approval.requested",
            str(created.id),
            tenant=job.tenant,
            request_id=request_id,
            job=job.id,
            title=title,
            policy=created.policy,
            deadline=created.deadline.isoformat(),
        )
    log.info("approval_requested", approval=created.id, job=job.id, policy=created.policy)
    return created


async def get(db: Database, caller: Caller, approval_id: int) -> ApprovalRecord:
    """One request the caller sees (settled first: an overdue one reads as timed out)."""
    async with db.begin() as conn:
        await _settle(conn, [approval_id])
        found = await approvals_q.get(conn, approval_id, tenants=caller.tenant_filter())
    if found is None or not _own_job(caller, found):
        raise NotFound(f"no approval request {approval_id}")
    return found


async def list_visible(
    db: Database, caller: Caller, *, state: str | None, job: int | None, limit: int
) -> list[ApprovalRecord]:
    if state is not None and state not in {str(s) for s in State}:
        raise Invalid(f"unknown state {state!r}; one of {', '.join(s.value for s in State)}")
    if not 1 <= limit <= 10000:
        raise Invalid("limit must be between 1 and 10000")
    async with db.begin() as conn:
        await _settle(conn, None)
        found = await approvals_q.list_visible(
            conn, tenants=caller.tenant_filter(), state=state, job_id=job, limit=limit
        )
    return [a for a in found if _own_job(caller, a)]


async def answer(
    db: Database,
    caller: Caller,
    approval_id: int,
    *,
    approve: bool,
    reason: str = "",
    request_id: str = "",
) -> ApprovalRecord:
    """Approve or deny a pending request, as a member of its job's tenant (see the policy).

    A refusal of someone who sees the request (a job, the creator under four-eyes) is audited
    too, as `approval.refused`: an attempt to approve one's own step is worth knowing of.
    """
    if len(reason) > MAX_DETAILS:
        raise Invalid(f"a reason is at most {MAX_DETAILS} characters")
    state = State.APPROVED if approve else State.DENIED
    async with db.begin() as conn:
        await _settle(conn, [approval_id])
        found = await approvals_q.get(conn, approval_id, tenants=caller.tenant_filter())
        if found is None:
            raise NotFound(f"no approval request {approval_id}")
        refusal = _refusal(caller, found)
        if refusal is None:
            answered = await approvals_q.answer(
                conn, approval_id, state=state, by=str(caller), reason=reason
            )
            if answered is None:
                raise Conflict(f"approval request {approval_id} is already {found.state}")
            await audit.record(
                conn,
                caller,
                f"approval.{state}",
                str(approval_id),
                tenant=found.tenant,
                request_id=request_id,
                job=found.job_id,
                title=found.title,
                reason=reason,
            )
            log.info("approval_answered", approval=approval_id, state=str(state), by=str(caller))
            return answered  # (committed on the way out)
    async with db.begin() as conn:  # the refusal on its own: nothing was answered
        await audit.record(
            conn,
            caller,
            "approval.refused",
            str(approval_id),
            tenant=found.tenant,
            request_id=request_id,
            job=found.job_id,
            wanted=str(state),
            refusal=refusal,
        )
    log.warning("approval_refused", approval=approval_id, by=str(caller), reason=refusal)
    raise Forbidden(refusal)


def _refusal(caller: Caller, found: ApprovalRecord) -> str | None:
    """Why `caller`, who sees the request, may not answer it; None when it may."""
    if caller.kind is Kind.JOB:
        # Security: a job (or one it submitted) answering would be the job approving itself.
        return "a job may not answer an approval request"
    if found.policy == Policy.FOUR_EYES and str(caller) == found.job_creator:
        return (
            f"approval request {found.id} is four-eyes ([pools.{found.pool}] approvals): "
            f"{found.job_creator} created job {found.job_id} and may not answer it; another "
            f"member of tenant {found.tenant} must"
        )
    return None


async def settle(db: Database) -> int:
    """Time out every overdue request and close those whose lease ended (the leader's pass)."""
    async with db.begin() as conn:
        return await _settle(conn, None)


async def waiting(db: Database, job: JobRecord) -> str:
    """What a running job waits for, when it waits for an answer; "" otherwise."""
    if job.state not in (JobState.LEASED, JobState.RUNNING):
        return ""
    async with db.begin() as conn:
        found = await approvals_q.pending_of_job(conn, job.id)
        while found is not None and await _settle(conn, [found.id]):
            found = await approvals_q.pending_of_job(conn, job.id)  # that one was overdue
    if found is None:
        return ""
    return (
        f"approval: {found.title} (request {found.id}, until "
        f"{found.deadline.isoformat(timespec='seconds')}; berth approval approve|deny {found.id})"
    )


async def _settle(conn: AsyncConnection, ids: list[int] | None) -> int:
    timed_out, closed = await approvals_q.settle(conn, ids)
    for record, action in [(a, "approval.timed_out") for a in timed_out] + [
        (a, "approval.closed") for a in closed
    ]:
        await audit.record(
            conn,
            SYSTEM,
            action,
            str(record.id),
            tenant=record.tenant,
            job=record.job_id,
            title=record.title,
            reason=record.reason,
        )
        log.info("approval_settled", approval=record.id, state=record.state, job=record.job_id)
    return len(timed_out) + len(closed)


def _own_job(caller: Caller, found: ApprovalRecord) -> bool:
    """A job sees only its own requests (its tenant's others are people's business)."""
    return caller.kind is not Kind.JOB or caller.name == str(found.job_id)
