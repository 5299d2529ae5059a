"""The UI's forms: sign in and out (token mode), cancel a job, drain / disable / enable a worker.

Every POST here is refused when it comes from another site, and (but login) without this
browser's CSRF token, before it reaches the domain call its API twin makes.
"""

from typing import Annotated, Any

from litestar import Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath
from litestar.response import Redirect, Template

from service.api.identity import identify, request_id, runtime_of
from service.api.ui import session
from service.api.ui.render import ERRORS, AnyRequest, bound_to, proxy_mode
from service.api.ui.routes import UI, _id
from service.auth.permissions import Perm
from service.core.errors import Invalid, Unauthenticated
from service.domain import approvals, fleet, jobs, tokens

Form = Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]


async def _checked(request: AnyRequest, form: dict[str, str]) -> None:
    """A write from this site's own page: same origin, and this browser's CSRF token."""
    session.check_same_origin(request.headers)
    caller = await identify(request)
    rt = runtime_of(request)
    session.check_csrf(
        rt.secret_key,
        bound_to(request, caller),
        form.get(session.CSRF_FIELD, "") or request.headers.get(session.CSRF_HEADER, ""),
    )


def _login_form(message: str = "", status: int = 200) -> Template:
    return Template(
        template_name="login.html",
        context={"message": message, "caller": None, "path": "/ui/login"},
        status_code=status,
        media_type="text/html",
    )


@get("/ui/login", opt={"public": True}, exception_handlers=ERRORS, include_in_schema=False)
async def login_form(request: AnyRequest) -> Template | Redirect:
    """The sign-in form (token mode); behind a proxy the proxy signs people in."""
    if proxy_mode(request):
        return Redirect("/ui/jobs", status_code=303)
    return _login_form()


@post(
    "/ui/login",
    opt={"public": True},
    exception_handlers=ERRORS,
    include_in_schema=False,
    status_code=303,
)
async def login(request: AnyRequest, data: Form) -> Response[Any]:
    """Trade a token for a session cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure on TLS)."""
    session.check_same_origin(request.headers)
    if proxy_mode(request):
        return Redirect("/ui/jobs", status_code=303)
    rt = runtime_of(request)
    token = data.get("token", "").strip()
    try:
        caller = await tokens.authenticate(rt.db, token) if token else None
    except Unauthenticated:
        caller = None
    if caller is None:
        return _login_form("That token is not valid (wrong, expired or revoked).", 401)
    answer = Redirect("/ui/jobs", status_code=303)
    answer.set_cookie(
        session.COOKIE,
        session.seal(rt.secret_key, token),
        path=session.PATH,
        max_age=session.SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


@post(
    "/ui/logout",
    opt={**UI, "perm": Perm.JOBS_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def logout(request: AnyRequest, data: Form) -> Redirect:
    """Forget this browser's session cookie."""
    await _checked(request, data)
    answer = Redirect("/ui/login", status_code=303)
    answer.delete_cookie(session.COOKIE, path=session.PATH)
    return answer


@post(
    "/ui/jobs/{job_id:int}/cancel",
    opt={**UI, "perm": Perm.JOBS_WRITE},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def cancel(request: AnyRequest, job_id: FromPath[int], data: Form) -> Redirect:
    """Cancel the job, as `job cancel` does; back to its page."""
    await _checked(request, data)
    rt = runtime_of(request)
    caller = await identify(request)
    await jobs.cancel(rt.db, caller, _id(job_id), request_id=request_id(request))
    return Redirect(f"/ui/jobs/{job_id}", status_code=303)


@post(
    "/ui/workers/{name:str}/{action:str}",
    opt={**UI, "perm": Perm.FLEET_WRITE},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def set_worker_state(
    request: AnyRequest, name: FromPath[str], action: FromPath[str], data: Form
) -> Redirect:
    """Drain, disable or enable a worker, as `worker drain` etc. do; back to the list."""
    await _checked(request, data)
    rt = runtime_of(request)
    caller = await identify(request)
    await fleet.set_state(
        rt.db,
        caller,
        name=name,
        state=fleet.parse_state(action),
        request_id=request_id(request),
    )
    return Redirect("/ui/workers", status_code=303)


@post(
    "/ui/approvals/{approval_id:int}/{verdict:str}",
    opt={**UI, "perm": Perm.JOBS_WRITE},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def answer_approval(
    request: AnyRequest, approval_id: FromPath[int], verdict: FromPath[str], data: Form
) -> Redirect:
    """Approve or deny as `approval approve|deny` do (the same four-eyes rule); back to the list."""
    await _checked(request, data)
    if verdict not in {"approve", "deny"}:
        raise Invalid(f"unknown answer {verdict!r}; approve or deny")
    rt = runtime_of(request)
    caller = await identify(request)
    await approvals.answer(
        rt.db,
        caller,
        _id(approval_id),
        approve=verdict == "approve",
        reason=data.get("reason", "").strip(),
        request_id=request_id(request),
    )
    return Redirect("/ui/approvals", status_code=303)


HANDLERS = [login_form, login, logout, cancel, set_worker_state, answer_approval]
