"""GET /api/v1/jobs/{id}/events: a job's state changes and new output, pushed as server-sent events.

Woken by NOTIFY berth_job_events_v1 through this server's one LISTEN connection (api/followers.py),
never by a timer: a follower of a silent job costs the database nothing. Each wake reads the job
and its output after the last chunk sent. The stream opens with the job's state, sends `state`
when it moves and `output` per chunk (SSE id = chunk id: a client resumes with `after` or
Last-Event-ID), and ends with `end` once the job has ended and all its output is sent.
"""

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from litestar import get
from litestar.params import FromQuery, HeaderParameter, PathParameter, QueryParameter
from litestar.response import Stream

from service.api import contract, deps
from service.api.followers import Followers
from service.api.limits_watch import InForceHere
from service.auth.callers import Caller
from service.auth.permissions import Perm
from service.core.errors import Invalid, NotFound
from service.core.states import JobState
from service.db.engine import Database
from service.db.records import JobRecord, OutputChunk
from service.domain import jobs
from service.domain.artifacts.server_store import ServerStore
from service.events import EndEvent, JobEvent, OutputEvent, StateEvent

MAX_ID = 2**63 - 1
# Chunk ids will not reach 2**53 (as for .../logs: the largest integer every JSON client holds).
MAX_CURSOR = 2**53
KEEPALIVE_SECONDS = 15.0  # an SSE comment, so proxies and clients see a live idle stream


def _sse(event: JobEvent, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    name = type(event).__struct_config__.tag
    return f"{head}event: {name}\n".encode() + b"data: " + msgspec.json.encode(event) + b"\n\n"


def _output(c: OutputChunk, encoding: str) -> OutputEvent:
    stream: Literal["stdout", "stderr"] = "stderr" if c.stream == "stderr" else "stdout"
    if encoding == "base64":
        return OutputEvent(id=c.id, stream=stream, b64=base64.b64encode(c.data).decode())
    return OutputEvent(id=c.id, stream=stream, data=c.data.decode("utf-8", "replace"))


async def _state(db: Database, here: InForceHere, job: JobRecord) -> StateEvent:
    # The limits as they are now (the stream outlives its request): what the job waits for.
    terminal = JobState(job.state).terminal
    waiting = "" if terminal else await jobs.waiting_for(db, job, here.pools, here.effective)
    return StateEvent(
        state=job.state,
        attempt=job.attempt,
        worker=job.worker,
        waiting_for=waiting,
        exit_code=job.exit_code,
        error=job.error,
    )


@dataclass(frozen=True)
class Server:
    """What a stream reads through: the parts of the server the handler was given."""

    db: Database
    here: InForceHere
    followers: Followers
    cas: ServerStore | None


async def follow(
    server: Server, caller: Caller, job_id: int, *, after: int, encoding: str, output: bool = True
) -> AsyncIterator[bytes]:
    """The event stream of one job, from output id `after`, until it ends (`output`: with it)."""
    db, followers = server.db, server.followers
    store = server.cas.store if server.cas is not None else None
    cursor = after
    last: StateEvent | None = None
    with followers.follow(job_id) as changed:
        while not followers.closed:
            changed.clear()  # before the read: a change during it wakes the next round
            if output:
                job, chunks = await jobs.output(db, caller, job_id, after=cursor, store=store)
            else:
                job, chunks = await jobs.get(db, caller, job_id), []
            state = await _state(db, server.here, job)
            if state != last:
                yield _sse(state)
                last = state
            for c in chunks:
                cursor = c.id
                yield _sse(_output(c, encoding), c.id)
            if chunks:
                continue  # a full page may leave more: read again before waiting
            if JobState(job.state).terminal:
                yield _sse(EndEvent(state=job.state, exit_code=job.exit_code, error=job.error))
                return
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=KEEPALIVE_SECONDS)
                    break
                yield b": keepalive\n\n"


def _resume_point(after: int, last_event_id: str | None) -> int:
    if last_event_id:
        try:
            after = max(after, int(last_event_id))
        except ValueError:
            raise Invalid("Last-Event-ID must be an output chunk id (an integer)") from None
    if not 0 <= after <= MAX_CURSOR:
        raise Invalid(f"after must be between 0 and {MAX_CURSOR}")
    return after


@get(
    "/api/v1/jobs/{job_id:int}/events",
    opt={"perm": Perm.JOBS_READ},
    operation_id="jobEvents",
    media_type=contract.EVENT_STREAM,
    responses=contract.events(404),
    operation_class=contract.EventsOperation,
)
async def events(
    *,
    job_id: Annotated[int, PathParameter(description="the job's id")],
    db: deps.Db,
    caller: deps.Caller,
    cas: deps.Cas,
    limits_here: deps.LimitsHere,
    followers: deps.JobFollowers,
    after: Annotated[
        int, QueryParameter(ge=0, le=MAX_CURSOR, description="output chunks after this id")
    ] = 0,
    encoding: FromQuery[Literal["text", "base64"]] = "text",
    output: Annotated[bool, QueryParameter(description="false: state changes and end only")] = True,
    last_event_id: Annotated[
        str,
        HeaderParameter(
            name="Last-Event-ID",
            pattern=r"^[0-9]{0,16}$",
            required=False,
            description="resume after this chunk (empty: from `after`)",
        ),
    ] = "",
) -> Stream:
    """Follow a job: its state changes and new output, pushed until it ends."""
    start = _resume_point(after, last_event_id)
    if not 1 <= job_id <= MAX_ID:
        raise NotFound(f"no job {job_id}")
    await jobs.get(db, caller, job_id)  # 404 for a job the caller may not see, before streaming
    server = Server(db=db, here=limits_here, followers=followers, cas=cas)
    return Stream(
        follow(server, caller, job_id, after=start, encoding=encoding, output=output),
        media_type=contract.EVENT_STREAM,
        # nginx buffers a proxied answer unless told; an event must reach the client at once
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
