"""The UI's pages: jobs, a job (with its live output), workers, pools, audit; static assets.

Each page declares the permission its API twin does and reads through the same domain calls,
so it shows exactly what that caller's API calls would.
"""

from typing import Annotated, Any

from litestar import Response, get
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Redirect, Template

from service.api import cas_wire
from service.api.identity import identify, runtime_of
from service.api.ui.render import ERRORS, STATIC, AnyRequest, page
from service.auth.permissions import Perm
from service.core.errors import NotFound, Unavailable
from service.core.states import JobState
from service.domain import approvals, audit, fleet, jobs
from service.domain.artifacts import access

UI = {"ui": True}
OUTPUT_SHOWN = 64 * 1024  # bytes of output a job page starts with (the newest)
MAX_ID = 2**63 - 1


def _id(job_id: int) -> int:
    if not 1 <= job_id <= MAX_ID:
        raise NotFound(f"no job {job_id}")
    return job_id


def _blank(value: str | None) -> str | None:
    return value.strip() or None if value else None


@get("/ui", opt={**UI, "perm": Perm.JOBS_READ}, exception_handlers=ERRORS, include_in_schema=False)
async def home(request: AnyRequest) -> Redirect:
    """The jobs page is the home page."""
    await identify(request)
    return Redirect("/ui/jobs", status_code=303)


@get(
    "/ui/jobs",
    opt={**UI, "perm": Perm.JOBS_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def job_list(  # noqa: PLR0917  (one query parameter per filter)
    request: AnyRequest,
    job_state: Annotated[str | None, QueryParameter(name="state")] = None,
    tenant: FromQuery[str | None] = None,
    pool: FromQuery[str | None] = None,
    worker: FromQuery[str | None] = None,
    creator: FromQuery[str | None] = None,
    limit: FromQuery[int] = 100,
) -> Template:
    """Jobs the caller may see, newest first, filtered like `job list`."""
    rt = runtime_of(request)
    caller = await identify(request)
    filters = {
        "state": _blank(job_state),
        "tenant": _blank(tenant),
        "pool": _blank(pool),
        "worker": _blank(worker),
        "creator": _blank(creator),
    }
    found = await jobs.list_visible(rt.db, caller, limit=limit, **filters)
    return await page(
        request,
        "jobs.html",
        jobs=found,
        filters={k: v or "" for k, v in filters.items()},
        states=[s.value for s in JobState],
        limit=limit,
    )


@get(
    "/ui/jobs/{job_id:int}",
    opt={**UI, "perm": Perm.JOBS_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def job_page(request: AnyRequest, job_id: FromPath[int]) -> Template:
    """One job: state, why it waits, attempts, worker, metrics, files, output, cancel."""
    rt = runtime_of(request)
    caller = await identify(request)
    store = rt.cas.store if rt.cas is not None else None
    job, chunks = await jobs.output(rt.db, caller, _id(job_id), after=0, store=store)
    text, after = _tail(chunks)
    return await page(
        request,
        "job.html",
        job=job,
        live=not JobState(job.state).terminal,
        waiting_for=await jobs.waiting_for(rt.db, job, rt.pools, rt.effective),
        attempts=await jobs.attempts(rt.db, caller, job.id),
        output=text,
        after=after,
    )


def _tail(chunks: list[Any]) -> tuple[str, int]:
    """The newest OUTPUT_SHOWN bytes of output as text, and the id to follow from."""
    data = b"".join(c.data for c in chunks)
    cut = len(data) > OUTPUT_SHOWN
    text = data[-OUTPUT_SHOWN:].decode("utf-8", "replace")
    return ("[… older output cut: `berth job logs` has it all]\n" if cut else "") + text, (
        chunks[-1].id if chunks else 0
    )


@get(
    "/ui/jobs/{job_id:int}/output",
    opt={**UI, "perm": Perm.JOBS_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def job_output(
    request: AnyRequest, job_id: FromPath[int], after: FromQuery[int] = 0
) -> Template:
    """The output after `after` (an htmx fragment the job page polls while the job runs)."""
    rt = runtime_of(request)
    caller = await identify(request)
    store = rt.cas.store if rt.cas is not None else None
    job, chunks = await jobs.output(
        rt.db, caller, _id(job_id), after=max(0, min(after, MAX_ID)), store=store
    )
    text, last = _tail(chunks)
    return await page(
        request,
        "output.html",
        job=job,
        text=text,
        after=last or after,
        live=not JobState(job.state).terminal,
    )


@get(
    "/ui/jobs/{job_id:int}/files/{sha256:str}",
    opt={**UI, "perm": Perm.JOBS_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def job_file(
    request: AnyRequest, job_id: FromPath[int], sha256: FromPath[str]
) -> Response[Any]:
    """One of the job's inputs or outputs, as a download (only blobs the job names)."""
    rt = runtime_of(request)
    caller = await identify(request)
    job = await jobs.get(rt.db, caller, _id(job_id))
    names = {i["sha256"]: i["name"] for i in job.inputs} | {
        o["sha256"]: o["path"] for o in job.outputs
    }
    if sha256 not in names:
        raise NotFound(f"job {job.id} has no file {sha256}")
    if rt.cas is None:
        raise Unavailable("this server offers no artifact store")
    size = await access.stat(rt.db, rt.cas, caller, sha256=sha256, tenant=job.tenant)
    answer = await cas_wire.send(rt.cas, sha256, size, None)
    filename = names[sha256].rsplit("/", 1)[-1].replace('"', "_") or sha256
    answer.headers["content-disposition"] = f'attachment; filename="{filename}"'
    return answer


@get(
    "/ui/workers",
    opt={**UI, "perm": Perm.FLEET_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def workers(request: AnyRequest) -> Template:
    """Workers the caller may see, with why each gets no lease; drain etc. for operators."""
    rt = runtime_of(request)
    rows, starting = await fleet.list_workers(rt.db, rt.pools, await identify(request))
    return await page(request, "workers.html", workers=rows, starting=starting)


@get(
    "/ui/pools",
    opt={**UI, "perm": Perm.FLEET_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def pools(request: AnyRequest) -> Template:
    """Pools with queue depth per kind, limits in force (who, why), provisioned workers."""
    rt = runtime_of(request)
    caller = await identify(request)
    status = await fleet.status(rt.db, rt.limits, tenants=fleet.named_for(caller), shown_to=caller)
    queued: dict[str, dict[str, int]] = {}
    for q in status["queued"]:
        queued.setdefault(q["pool"] or "*", {})[q["kind"]] = q["jobs"]
    return await page(
        request,
        "pools.html",
        pools=sorted(status["pools"].items()),
        queued=queued,
        running=status["running"],
        limits=status["limits"],
    )


@get(
    "/ui/audit", opt={**UI, "perm": Perm.AUDIT}, exception_handlers=ERRORS, include_in_schema=False
)
async def audit_page(  # noqa: PLR0917  (one query parameter per filter)
    request: AnyRequest,
    caller: FromQuery[str | None] = None,
    action: FromQuery[str | None] = None,
    tenant: FromQuery[str | None] = None,
    target: FromQuery[str | None] = None,
    limit: FromQuery[int] = 200,
) -> Template:
    """The newest audit entries, filtered; the chain's check is one click away."""
    rt = runtime_of(request)
    who = await identify(request)
    limit = max(1, min(limit, 10000))
    asked = {"caller": caller, "action": action, "tenant": tenant, "target": target}
    match = {k: v.strip() for k, v in asked.items() if v and v.strip()}
    entries = await audit.recent(rt.db, who, limit=limit, match=match)
    return await page(
        request,
        "audit.html",
        entries=entries,
        filters={k: match.get(k, "") for k in ("caller", "action", "tenant", "target")},
        limit=limit,
    )


@get(
    "/ui/audit/verify",
    opt={**UI, "perm": Perm.AUDIT},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def audit_verify(request: AnyRequest) -> Template:
    """`berth audit verify` as this server can run it (with its key; its kept head aside)."""
    rt = runtime_of(request)
    result = await audit.verify(rt.db, rt.secret_key or None)
    return await page(request, "verify.html", result=result)


@get(
    "/ui/approvals",
    opt={**UI, "perm": Perm.JOBS_READ},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def approval_list(
    request: AnyRequest,
    approval_state: Annotated[str | None, QueryParameter(name="state")] = "pending",
    job: FromQuery[int | None] = None,
) -> Template:
    """Approval requests of the caller's tenants' jobs (pending first); approve or deny."""
    rt = runtime_of(request)
    caller = await identify(request)
    state = _blank(approval_state)
    found = await approvals.list_visible(
        rt.db, caller, state=state, job=_id(job) if job is not None else None, limit=200
    )
    return await page(
        request,
        "approvals.html",
        approvals=found,
        state=state or "",
        states=[s.value for s in approvals.State],
        job=job,
    )


ASSETS = {
    "htmx.min.js": "text/javascript",
    "berth.css": "text/css",
}


@get(
    "/ui/static/{name:str}",
    opt={"public": True},
    exception_handlers=ERRORS,
    include_in_schema=False,
)
async def static(name: FromPath[str]) -> Response[bytes]:
    """The UI's own assets, from the package (no CDN)."""
    if name not in ASSETS:
        raise NotFound(f"no asset {name}")
    return Response(
        (STATIC / name).read_bytes(),
        media_type=ASSETS[name],
        headers={"cache-control": "public, max-age=3600"},
    )


HANDLERS = [
    home,
    job_list,
    job_page,
    job_output,
    job_file,
    workers,
    pools,
    audit_page,
    audit_verify,
    approval_list,
    static,
]
