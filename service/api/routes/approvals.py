"""/api/v1/approvals: a job asks (POST, relayed as `job:<id>`), people list, show and answer."""

from typing import Annotated

import msgspec
from litestar import get, post
from litestar.params import JSONBody, PathParameter, QueryParameter

from service.api import body, contract, deps
from service.auth.callers import Caller
from service.auth.permissions import Perm
from service.core.errors import NotFound
from service.db.engine import Database
from service.db.records import ApprovalRecord
from service.domain import approvals
from service.views import ApprovalView

MAX_ID = 2**63 - 1
# The largest job id the document can state exactly (2**63 - 1 rounds up as a double).
MAX_JOB = 2**63 - 1024
Text = Annotated[str, msgspec.Meta(max_length=approvals.MAX_DETAILS, pattern=body.NO_NUL)]
ApprovalId = Annotated[int, PathParameter(description="the approval request's id")]


class AskBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    title: Annotated[
        str, msgspec.Meta(min_length=1, max_length=approvals.MAX_TITLE, pattern=body.NO_NUL)
    ]
    details: Text = ""


class AnswerBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: Text = ""


def approval_view(a: ApprovalRecord) -> ApprovalView:
    return ApprovalView(
        id=a.id,
        job=a.job_id,
        tenant=a.tenant,
        pool=a.pool,
        title=a.title,
        details=a.details,
        state=a.state,
        approved=a.state == approvals.State.APPROVED,
        policy=a.policy,
        job_creator=a.job_creator,
        created_at=a.created_at,
        deadline=a.deadline,
        answered_by=a.answered_by,
        answered_at=a.answered_at,
        reason=a.reason,
    )


def _id(approval_id: int) -> int:
    # Any integer is a well-formed id; one no request can have is one that does not exist.
    if not 1 <= approval_id <= MAX_ID:
        raise NotFound(f"no approval request {approval_id}")
    return approval_id


@post(
    "/api/v1/approvals",
    opt={"perm": Perm.JOBS_WRITE},
    status_code=201,
    operation_id="askApproval",
    responses=contract.errors(409, 413),
)
async def ask(
    data: JSONBody[AskBody],
    db: deps.Db,
    caller: deps.Caller,
    effective: deps.Effective,
    request_id: deps.RequestId,
) -> ApprovalView:
    """A job's request (only a job's relayed call may ask); answered by people."""
    created = await approvals.ask(
        db,
        caller,
        effective.pools,
        title=data.title,
        details=data.details,
        request_id=request_id,
    )
    return approval_view(created)


@get(
    "/api/v1/approvals",
    opt={"perm": Perm.JOBS_READ},
    operation_id="listApprovals",
    responses=contract.errors(),
)
async def list_approvals(
    db: deps.Db,
    caller: deps.Caller,
    approval_state: Annotated[
        approvals.State | None, QueryParameter(name="state", description="only these")
    ] = None,
    job: Annotated[int | None, QueryParameter(ge=1, le=MAX_JOB, description="of this job")] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=10000)] = 100,
) -> list[ApprovalView]:
    """The requests the caller may see, newest first."""
    state = approval_state.value if approval_state else None
    found = await approvals.list_visible(db, caller, state=state, job=job, limit=limit)
    return [approval_view(a) for a in found]


@get(
    "/api/v1/approvals/{approval_id:int}",
    opt={"perm": Perm.JOBS_READ},
    operation_id="showApproval",
    responses=contract.errors(404),
)
async def show(approval_id: ApprovalId, db: deps.Db, caller: deps.Caller) -> ApprovalView:
    """One request."""
    return approval_view(await approvals.get(db, caller, _id(approval_id)))


async def _answer(
    db: Database,
    caller: Caller,
    request_id: str,
    approval_id: int,
    data: AnswerBody | None,
    *,
    approve: bool,
) -> ApprovalView:
    answered = await approvals.answer(
        db,
        caller,
        _id(approval_id),
        approve=approve,
        reason=(data or AnswerBody()).reason,
        request_id=request_id,
    )
    return approval_view(answered)


@post(
    "/api/v1/approvals/{approval_id:int}/approve",
    opt={"perm": Perm.JOBS_WRITE},
    status_code=200,
    operation_id="approve",
    responses=contract.errors(404, 409, 413),
)
async def approve(
    approval_id: ApprovalId,
    db: deps.Db,
    caller: deps.Caller,
    request_id: deps.RequestId,
    data: JSONBody[AnswerBody | None] = None,
) -> ApprovalView:
    """Say yes, as a member of the job's tenant ([pools.P] approvals says which)."""
    return await _answer(db, caller, request_id, approval_id, data, approve=True)


@post(
    "/api/v1/approvals/{approval_id:int}/deny",
    opt={"perm": Perm.JOBS_WRITE},
    status_code=200,
    operation_id="deny",
    responses=contract.errors(404, 409, 413),
)
async def deny(
    approval_id: ApprovalId,
    db: deps.Db,
    caller: deps.Caller,
    request_id: deps.RequestId,
    data: JSONBody[AnswerBody | None] = None,
) -> ApprovalView:
    """Say no, as a member of the job's tenant ([pools.P] approvals says which)."""
    return await _answer(db, caller, request_id, approval_id, data, approve=False)
