"""/api/v1/jobs: submit (one or a list), list, show, cancel, output."""

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, get, post
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Stream

from service.api import body
from service.api.body import decode
from service.api.identity import identify, request_id, runtime_of
from service.auth.permissions import Perm
from service.core import resources
from service.core.errors import Invalid, NotFound
from service.core.states import JobState
from service.db.records import JobRecord, OutputChunk
from service.domain import jobs

MAX_ID = 2**63 - 1


class InputBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=r"\A[^/\x00]+\Z")]
    sha256: Annotated[str, msgspec.Meta(pattern=r"\A[0-9a-f]{64}\Z")]
    kind: Literal["file", "dir"] = "file"


class JobBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    command: Annotated[list[body.Arg], msgspec.Meta(max_length=4096)] = msgspec.field(
        default_factory=list
    )
    python: body.Source = ""
    # Names are checked by the domain (its error names the bad one); here: bounded, no NUL.
    env: Annotated[dict[body.Arg, body.Arg], msgspec.Meta(max_length=1024)] = msgspec.field(
        default_factory=dict
    )
    kind: body.Kind = "default"
    pool: body.Name | None = None
    labels: Annotated[list[body.Label], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    device_policy: Literal["require", "prefer"] = "require"
    timeout_seconds: body.Seconds = 0.0
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3
    priority: body.Int32 = 0
    tenant: body.Name | None = None
    # variable -> secret name
    secrets: Annotated[dict[body.Arg, body.Name], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=dict
    )
    inputs: Annotated[list[InputBody], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    repo: Annotated[str, msgspec.Meta(max_length=2048, pattern=body.NO_NUL)] = ""
    # Resources (SPEC section 4); null/absent: the pool's default (0 without a pool).
    cpus: Annotated[float, msgspec.Meta(ge=0, le=resources.MAX_CPUS)] | None = None
    memory_mb: Annotated[int, msgspec.Meta(ge=0, le=resources.MAX_MEMORY_MB)] | None = None
    gpus: Annotated[int, msgspec.Meta(ge=0, le=resources.MAX_GPUS)] | None = None


def job_json(job: JobRecord, waiting_for: str = "") -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "exit_code": job.exit_code,
        "error": job.error,
        "worker": job.worker,
        "tenant": job.tenant,
        "kind": job.kind,
        "pool": job.pool,
        "labels": job.labels,
        "device_policy": job.device_policy,
        "priority": job.priority,
        "timeout_seconds": job.timeout_seconds,
        "cpus": job.cpus,
        "memory_mb": job.memory_mb,
        "gpus": job.gpus,
        "command": job.command,
        "python": bool(job.python or job.python_sha256),
        "python_sha256": job.python_sha256 or None,
        "inputs": job.inputs,
        "repo": job.repo or None,
        "outputs": job.outputs,
        "metrics": job.metrics,
        "env": sorted(job.env),  # names only: values may be sensitive
        "secrets": sorted(job.secrets),
        "created_by": job.created_by,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "waiting_for": waiting_for,
    }


def _spec(b: JobBody) -> jobs.JobSpec:
    return jobs.JobSpec(
        command=b.command,
        python=b.python,
        env=b.env,
        kind=b.kind,
        pool=b.pool,
        labels=b.labels,
        device_policy=b.device_policy,
        timeout_seconds=b.timeout_seconds,
        max_attempts=b.max_attempts,
        priority=b.priority,
        tenant=b.tenant,
        secrets=b.secrets,
        inputs=[{"name": i.name, "sha256": i.sha256, "kind": i.kind} for i in b.inputs],
        repo=b.repo,
        cpus=b.cpus,
        memory_mb=b.memory_mb,
        gpus=b.gpus,
    )


def _id(job_id: int) -> int:
    if not 1 <= job_id <= MAX_ID:
        raise NotFound(f"no job {job_id}")
    return job_id


@post("/api/v1/jobs", opt={"perm": Perm.JOBS_WRITE}, status_code=201)
async def submit(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Queue one job (an object) or many (a list); all or none."""
    rt = runtime_of(request)
    caller = await identify(request)
    payload: JobBody | list[JobBody] = await decode(request, JobBody | list[JobBody])
    batch = isinstance(payload, list)
    bodies = payload if isinstance(payload, list) else [payload]
    created = await jobs.submit(
        rt.db,
        caller,
        [_spec(b) for b in bodies],
        rt.pools,
        in_force=rt.effective,
        request_id=request_id(request),
        cas=rt.cas,
    )
    rt.hub.poke()  # this server's workers need not wait for the NOTIFY round trip
    if batch:
        return {"ids": [j.id for j in created]}
    return job_json(created[0])


@get("/api/v1/jobs", opt={"perm": Perm.JOBS_READ})
async def list_jobs(
    request: Request[Any, Any, Any],
    job_state: Annotated[str | None, QueryParameter(name="state")] = None,
    tenant: FromQuery[str | None] = None,
    limit: FromQuery[int] = 100,
) -> list[dict[str, Any]]:
    rt = runtime_of(request)
    caller = await identify(request)
    found = await jobs.list_visible(rt.db, caller, state=job_state, tenant=tenant, limit=limit)
    return [job_json(j) for j in found]


@get("/api/v1/jobs/{job_id:int}", opt={"perm": Perm.JOBS_READ})
async def show(request: Request[Any, Any, Any], job_id: FromPath[int]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    job = await jobs.get(rt.db, caller, _id(job_id))
    return job_json(job, await jobs.waiting_for(rt.db, job, rt.pools, rt.effective))


@post("/api/v1/jobs/{job_id:int}/cancel", opt={"perm": Perm.JOBS_WRITE}, status_code=200)
async def cancel(request: Request[Any, Any, Any], job_id: FromPath[int]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    return job_json(await jobs.cancel(rt.db, caller, _id(job_id), request_id=request_id(request)))


def _chunk(c: OutputChunk, encoding: str) -> dict[str, Any]:
    """Output is bytes: as base64 (exact), or as text with invalid UTF-8 replaced visibly."""
    if encoding == "base64":
        return {"id": c.id, "stream": c.stream, "b64": base64.b64encode(c.data).decode()}
    return {"id": c.id, "stream": c.stream, "data": c.data.decode("utf-8", "replace")}


@get("/api/v1/jobs/{job_id:int}/logs", opt={"perm": Perm.JOBS_READ}, response_model=None)
async def logs(
    request: Request[Any, Any, Any],
    job_id: FromPath[int],
    after: FromQuery[int] = 0,
    follow: FromQuery[bool] = False,
    encoding: FromQuery[Literal["text", "base64"]] = "text",
) -> dict[str, Any] | Stream:
    """Output so far; with follow=true, NDJSON lines until the job ends, then its result."""
    rt = runtime_of(request)
    caller = await identify(request)
    if not 0 <= after <= MAX_ID:
        raise Invalid(f"after must be between 0 and {MAX_ID}")
    store = rt.cas.store if rt.cas is not None else None
    job, chunks = await jobs.output(rt.db, caller, _id(job_id), after=after, store=store)
    if not follow:
        return {
            "state": job.state,
            "exit_code": job.exit_code,
            "chunks": [_chunk(c, encoding) for c in chunks],
        }

    async def lines() -> AsyncIterator[bytes]:
        cursor = after
        idle = 0.05
        while True:
            current, got = await jobs.output(rt.db, caller, job_id, after=cursor, store=store)
            for c in got:
                cursor = c.id
                yield msgspec.json.encode(_chunk(c, encoding)) + b"\n"
            if JobState(current.state).terminal and not got:
                yield (
                    msgspec.json.encode(
                        {
                            "state": current.state,
                            "exit_code": current.exit_code,
                            "error": current.error,
                        }
                    )
                    + b"\n"
                )
                return
            if got:
                idle = 0.05
                continue
            await asyncio.sleep(idle)
            idle = min(idle * 2, 0.5)

    return Stream(lines(), media_type="application/x-ndjson")
