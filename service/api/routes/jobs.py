"""/api/v1/jobs: submit (one or a list), list, show, cancel, output."""

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Annotated, Any, ClassVar, Literal, cast

import msgspec
from litestar import get, post
from litestar.params import FromQuery, JSONBody, PathParameter, QueryParameter
from litestar.response import Stream

from service.api import body, contract, deps
from service.auth.permissions import Perm
from service.core import resources
from service.core.errors import NotFound
from service.core.states import JobState
from service.db.records import JobRecord, OutputChunk
from service.domain import jobs
from service.views import (
    ArtifactView,
    ChunkView,
    InputView,
    JobIdsView,
    JobView,
    LogEndView,
    LogsView,
)

MAX_ID = 2**63 - 1
# Chunk ids will not reach 2**53 (the largest integer a JSON number holds exactly in every
# client), and the document can state it exactly (2**63 - 1 rounds up as a double).
MAX_CURSOR = 2**53
# An input lands in the job's folder under its name: a file name, never "." or "..".
INPUT_NAME = r"\A(?!\.\.?\Z)[^/\x00]{1,255}\Z"


class InputBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=INPUT_NAME)]
    sha256: Annotated[str, msgspec.Meta(pattern=r"\A[0-9a-f]{64}\Z")]
    kind: Literal["file", "dir"] = "file"


class JobBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One job. Give exactly one of `command` and `python`."""

    # domain/jobs.py validate's rules over several fields or a key, in the document (the
    # domain checks them, its error naming the bad key): one of command and python non-empty,
    # the other empty; environment variable names.
    JSON_SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {
        "properties": {
            "env": {"propertyNames": {"pattern": jobs.ENV_KEY.pattern}},
            "secrets": {"propertyNames": {"pattern": jobs.ENV_KEY.pattern}},
        },
        "oneOf": [
            {
                "required": ["command"],
                "properties": {"command": {"minItems": 1}, "python": {"maxLength": 0}},
            },
            {
                "required": ["python"],
                "properties": {"python": {"minLength": 1}, "command": {"maxItems": 0}},
            },
        ],
    }

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
    timeout_seconds: body.Seconds = 0.0  # 0: no timeout
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
    # URL[@REV]; never one that would pass for a git option
    repo: Annotated[str, msgspec.Meta(max_length=2048, pattern=r"\A(?!-)[^\x00]*\Z")] = ""
    # Resources (SPEC section 4); null/absent: the pool's default (0 without a pool).
    cpus: Annotated[float, msgspec.Meta(ge=0, le=resources.MAX_CPUS)] | None = None
    memory_mb: Annotated[int, msgspec.Meta(ge=0, le=resources.MAX_MEMORY_MB)] | None = None
    gpus: Annotated[int, msgspec.Meta(ge=0, le=resources.MAX_GPUS)] | None = None


# At least one job: the domain says "no jobs given" (msgspec's own error would not).
JobBatch = Annotated[
    list[JobBody], msgspec.Meta(max_length=jobs.MAX_BATCH, extra_json_schema={"minItems": 1})
]


def job_view(job: JobRecord, waiting_for: str = "") -> JobView:
    return JobView(
        id=job.id,
        state=job.state,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        exit_code=job.exit_code,
        error=job.error,
        worker=job.worker,
        tenant=job.tenant,
        kind=job.kind,
        pool=job.pool,
        labels=job.labels,
        device_policy=job.device_policy,
        priority=job.priority,
        timeout_seconds=job.timeout_seconds,
        cpus=job.cpus,
        memory_mb=job.memory_mb,
        gpus=job.gpus,
        command=job.command,
        python=bool(job.python or job.python_sha256),
        python_sha256=job.python_sha256 or None,
        inputs=msgspec.convert(job.inputs, list[InputView]),
        repo=job.repo or None,
        outputs=msgspec.convert(job.outputs, list[ArtifactView]),
        metrics=job.metrics,
        env=sorted(job.env),  # names only: values may be sensitive
        secrets=sorted(job.secrets),
        created_by=job.created_by,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        waiting_for=waiting_for,
    )


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
    # Any integer is a well-formed id; one no job can have is a job that does not exist.
    if not 1 <= job_id <= MAX_ID:
        raise NotFound(f"no job {job_id}")
    return job_id


JobId = Annotated[int, PathParameter(description="the job's id")]


@post(
    "/api/v1/jobs",
    opt={"perm": Perm.JOBS_WRITE},
    status_code=201,
    operation_id="submitJobs",
    responses=contract.errors(404, 409, 413, 429),
    description=(
        "Queue one job (an object; answers the job) or many (a list; answers their ids), all "
        "or none. 404: a pool that does not exist, or an input blob or secret the tenant does "
        "not hold; 409: a kind no pool (or not the named pool) has slots of now; 429: past the "
        "tenant's max_queued."
    ),
)
async def submit(
    *,
    data: JSONBody[JobBody | JobBatch],
    db: deps.Db,
    caller: deps.Caller,
    pools: deps.Pools,
    effective: deps.Effective,
    cas: deps.Cas,
    request_id: deps.RequestId,
    poke: deps.Poke,
    queued: deps.Queued,
) -> JobView | JobIdsView:
    """Queue one job (an object) or many (a list); all or none."""
    bodies = data if isinstance(data, list) else [data]
    created = await jobs.submit(
        db,
        caller,
        [_spec(b) for b in bodies],
        pools,
        in_force=effective,
        request_id=request_id,
        cas=cas,
        queued=queued,
    )
    poke()  # this server's workers need not wait for the NOTIFY round trip
    if isinstance(data, list):
        return JobIdsView(ids=[j.id for j in created])
    return job_view(created[0])


@get(
    "/api/v1/jobs",
    opt={"perm": Perm.JOBS_READ},
    operation_id="listJobs",
    responses=contract.errors(),
)
async def list_jobs(
    db: deps.Db,
    caller: deps.Caller,
    job_state: Annotated[
        JobState | None, QueryParameter(name="state", description="only jobs in this state")
    ] = None,
    tenant: Annotated[str | None, QueryParameter(**body.NAME_PARAM)] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=10000)] = 100,
) -> list[JobView]:
    """The newest jobs the caller may see, of one state or tenant when asked."""
    found = await jobs.list_visible(
        db, caller, state=job_state.value if job_state else None, tenant=tenant, limit=limit
    )
    return [job_view(j) for j in found]


@get(
    "/api/v1/jobs/{job_id:int}",
    opt={"perm": Perm.JOBS_READ},
    operation_id="showJob",
    responses=contract.errors(404),
)
async def show(
    job_id: JobId, db: deps.Db, caller: deps.Caller, pools: deps.Pools, effective: deps.Effective
) -> JobView:
    """One job, with what it waits for when it is queued."""
    job = await jobs.get(db, caller, _id(job_id))
    return job_view(job, await jobs.waiting_for(db, job, pools, effective))


@post(
    "/api/v1/jobs/{job_id:int}/cancel",
    opt={"perm": Perm.JOBS_WRITE},
    status_code=200,
    operation_id="cancelJob",
    responses=contract.errors(404),
)
async def cancel(
    job_id: JobId, db: deps.Db, caller: deps.Caller, request_id: deps.RequestId
) -> JobView:
    """Cancel a job; a running copy is killed by its worker. Cancelling an ended job is a no-op."""
    return job_view(await jobs.cancel(db, caller, _id(job_id), request_id=request_id))


def _chunk(c: OutputChunk, encoding: str) -> ChunkView:
    """Output is bytes: as base64 (exact), or as text with invalid UTF-8 replaced visibly."""
    stream = cast("Literal['stdout', 'stderr']", c.stream)  # the column holds only these
    if encoding == "base64":
        return ChunkView(id=c.id, stream=stream, b64=base64.b64encode(c.data).decode())
    return ChunkView(id=c.id, stream=stream, data=c.data.decode("utf-8", "replace"))


@get(
    "/api/v1/jobs/{job_id:int}/logs",
    opt={"perm": Perm.JOBS_READ},
    operation_id="jobLogs",
    responses=contract.errors(404),
    operation_class=contract.LogsOperation,
)
async def logs(
    *,
    job_id: JobId,
    db: deps.Db,
    caller: deps.Caller,
    cas: deps.Cas,
    after: Annotated[
        int, QueryParameter(ge=0, le=MAX_CURSOR, description="chunks after this id")
    ] = 0,
    follow: Annotated[bool, QueryParameter(description="stream NDJSON until the job ends")] = False,
    encoding: FromQuery[Literal["text", "base64"]] = "text",
) -> LogsView | Stream:
    """Output so far; with follow=true, NDJSON lines until the job ends, then its result."""
    store = cas.store if cas is not None else None
    job, chunks = await jobs.output(db, caller, _id(job_id), after=after, store=store)
    if not follow:
        return LogsView(
            state=job.state,
            exit_code=job.exit_code,
            chunks=[_chunk(c, encoding) for c in chunks],
        )

    async def lines() -> AsyncIterator[bytes]:
        cursor = after
        idle = 0.05
        while True:
            current, got = await jobs.output(db, caller, job_id, after=cursor, store=store)
            for c in got:
                cursor = c.id
                yield msgspec.json.encode(_chunk(c, encoding)) + b"\n"
            if JobState(current.state).terminal and not got:
                end = LogEndView(
                    state=current.state, exit_code=current.exit_code, error=current.error
                )
                yield msgspec.json.encode(end) + b"\n"
                return
            if got:
                idle = 0.05
                continue
            await asyncio.sleep(idle)
            idle = min(idle * 2, 0.5)

    # The header, not media_type alone: Litestar's Stream takes the handler's media type (JSON)
    # over its own, and NDJSON is what the document and the client expect.
    return Stream(lines(), media_type=contract.NDJSON, headers={"content-type": contract.NDJSON})
