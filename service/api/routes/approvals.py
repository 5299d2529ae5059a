"""/api/v1/approvals: a job asks (POST, relayed as `job:<id>`), people list, show and answer."""

from typing import Annotated, Any

import msgspec
from litestar import Request, get, post
from litestar.params import FromPath, FromQuery, QueryParameter

from service.api import body
from service.api.body import decode
from service.api.identity import identify, request_id, runtime_of
from service.auth.permissions import Perm
from service.core.errors import Invalid, NotFound
from service.db.records import ApprovalRecord
from service.domain import approvals

MAX_ID = 2**63 - 1
Text = Annotated[str, msgspec.Meta(max_length=approvals.MAX_DETAILS, pattern=body.NO_NUL)]


class AskBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    title: Annotated[
        str, msgspec.Meta(min_length=1, max_length=approvals.MAX_TITLE, pattern=body.NO_NUL)
    ]
    details: Text = ""


class AnswerBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: Text = ""


class ApprovalView(msgspec.Struct, kw_only=True):
    """One request as the API shows it; `approved` is what the asking job's call returns."""

    id: int
    job: int
    tenant: str
    pool: str
    title: str
    details: str
    state: str
    approved: bool
    policy: str
    job_creator: str
    created_at: str
    deadline: str
    answered_by: str | None
    answered_at: str | None
    reason: str

    @classmethod
    def of(cls, a: ApprovalRecord) -> "ApprovalView":
        return cls(
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
            created_at=a.created_at.isoformat(),
            deadline=a.deadline.isoformat(),
            answered_by=a.answered_by,
            answered_at=a.answered_at.isoformat() if a.answered_at else None,
            reason=a.reason,
        )


def _id(approval_id: int) -> int:
    if not 1 <= approval_id <= MAX_ID:
        raise NotFound(f"no approval request {approval_id}")
    return approval_id


@post("/api/v1/approvals", opt={"perm": Perm.JOBS_WRITE}, status_code=201)
async def ask(request: Request[Any, Any, Any]) -> ApprovalView:
    """A job's request (only a job's relayed call may ask); answered by people."""
    rt = runtime_of(request)
    caller = await identify(request)
    b: AskBody = await decode(request, AskBody)
    created = await approvals.ask(
        rt.db,
        caller,
        rt.effective.pools,
        title=b.title,
        details=b.details,
        request_id=request_id(request),
    )
    return ApprovalView.of(created)


@get("/api/v1/approvals", opt={"perm": Perm.JOBS_READ})
async def list_approvals(
    request: Request[Any, Any, Any],
    approval_state: Annotated[str | None, QueryParameter(name="state")] = None,
    job: FromQuery[int | None] = None,
    limit: FromQuery[int] = 100,
) -> list[ApprovalView]:
    rt = runtime_of(request)
    caller = await identify(request)
    if job is not None and not 1 <= job <= MAX_ID:
        raise Invalid(f"job must be between 1 and {MAX_ID}")
    found = await approvals.list_visible(rt.db, caller, state=approval_state, job=job, limit=limit)
    return [ApprovalView.of(a) for a in found]


@get("/api/v1/approvals/{approval_id:int}", opt={"perm": Perm.JOBS_READ})
async def show(request: Request[Any, Any, Any], approval_id: FromPath[int]) -> ApprovalView:
    rt = runtime_of(request)
    caller = await identify(request)
    return ApprovalView.of(await approvals.get(rt.db, caller, _id(approval_id)))


async def _answer(
    request: Request[Any, Any, Any], approval_id: int, *, approve: bool
) -> ApprovalView:
    rt = runtime_of(request)
    caller = await identify(request)
    raw = await request.body()
    b = await decode(request, AnswerBody) if raw.strip() else AnswerBody()
    answered = await approvals.answer(
        rt.db,
        caller,
        _id(approval_id),
        approve=approve,
        reason=b.reason,
        request_id=request_id(request),
    )
    return ApprovalView.of(answered)


@post("/api/v1/approvals/{approval_id:int}/approve", opt={"perm": Perm.JOBS_WRITE}, status_code=200)
async def approve(request: Request[Any, Any, Any], approval_id: FromPath[int]) -> ApprovalView:
    """Say yes, as a member of the job's tenant ([pools.P] approvals says which)."""
    return await _answer(request, approval_id, approve=True)


@post("/api/v1/approvals/{approval_id:int}/deny", opt={"perm": Perm.JOBS_WRITE}, status_code=200)
async def deny(request: Request[Any, Any, Any], approval_id: FromPath[int]) -> ApprovalView:
    """Say no, as a member of the job's tenant ([pools.P] approvals says which)."""
    return await _answer(request, approval_id, approve=False)
