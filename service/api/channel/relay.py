"""A job's own `berth` calls, relayed by its worker (SPEC section 4: the runtime inside a job).

The worker sends them over its socket naming the job's lease; they are answered only while that
lease is the worker's live one, and only for what a job may do: submit, list, show, wait for and
cancel jobs, read artifacts, ask for approval and read the answer. The call runs through this
server's own routes, guards and tenant filters as `job:<id>`, a member of the job's tenant only;
writes are signed `job:<id>` and the audit names the job's creator beside it.
"""

import json
import re
import urllib.parse
from typing import Any

import structlog

from service import protocol
from service.api.channel.session import Session
from service.auth.callers import Caller, Kind, Role
from service.core.errors import BerthError
from service.db.engine import Database
from service.domain import leasing

log = structlog.get_logger(__name__)

# (method, path pattern): the calls a job may make, and nothing else.
ALLOWED = (
    ("POST", re.compile(r"^/api/v1/jobs$")),
    ("GET", re.compile(r"^/api/v1/jobs(\?[^#]*)?$")),
    ("GET", re.compile(r"^/api/v1/jobs/\d+$")),
    ("POST", re.compile(r"^/api/v1/jobs/\d+/cancel$")),
    ("GET", re.compile(r"^/api/v1/jobs/\d+/logs(\?[^#]*)?$")),
    # request_approval: ask, then read the answer (only the job's own requests; never answer).
    ("POST", re.compile(r"^/api/v1/approvals$")),
    ("GET", re.compile(r"^/api/v1/approvals/\d+$")),
    # Only HEAD: the worker asks whether the job's tenant holds a blob, then reads it from the
    # store itself; a relayed answer is one frame, never a blob.
    ("HEAD", re.compile(r"^/api/v1/cas/[0-9a-f]{64}$")),
)
MAX_ANSWER = protocol.MAX_OUTPUT


def allowed(method: str, path: str) -> bool:
    return any(method == m and pattern.match(path) for m, pattern in ALLOWED)


def too_many(ask: protocol.RelayRequest, bound: int) -> protocol.RelayResponse:
    """The answer to a call past the session's bound on relayed calls in flight."""
    return protocol.RelayResponse(
        id=ask.id,
        status=429,
        body=_error(
            f"this worker has {bound} relayed calls in flight, its executor.relay_max_in_flight "
            f"= {bound}; retry when one is answered"
        ),
    )


async def answer(db: Database, session: Session, ask: protocol.RelayRequest) -> None:
    """Run one relayed call and send its answer to the worker."""
    status, body = await _run(db, session, ask)
    session.send(protocol.RelayResponse(id=ask.id, status=status, body=body[:MAX_ANSWER]))


async def _run(db: Database, session: Session, ask: protocol.RelayRequest) -> tuple[int, bytes]:
    if not allowed(ask.method, ask.path):
        return 403, b'{"error": "a job may not make this call"}'
    if "follow" in urllib.parse.parse_qs(ask.path.partition("?")[2]):
        # A relayed answer is one frame: a follow would hold the call open for the job's life.
        return 400, _error("a job may not follow output through the relay; wait for the job")
    try:
        job = await leasing.live_job(db, session.worker, job=ask.job, epoch=ask.epoch)
    except BerthError as exc:
        return exc.status, _error(exc.message)
    if job is None:
        return 410, _error("the job's lease has ended: its relay refuses")
    caller = Caller(
        Kind.JOB, str(job.id), Role.MEMBER, frozenset({job.tenant}), on_behalf=job.created_by
    )
    log.info("relayed_call", job=job.id, method=ask.method, path=ask.path.split("?")[0])
    # The app this worker's socket is served by: the call runs through the same routes.
    return await _call_app(session.socket.app, caller, ask.method, ask.path, ask.body)


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _call_app(
    app: Any,  # noqa: ANN401  (any ASGI app; Litestar's own in the server)
    caller: Caller,
    method: str,
    target: str,
    body: bytes,
) -> tuple[int, bytes]:
    """One request through this server's own app, as `caller` (identity already settled)."""
    path, _, query = target.partition("?")
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"relay")],
        "client": ("relay", 0),
        "server": ("relay", 0),
        "state": {"caller": caller, "request_id": f"relay-{caller.name}"},
    }
    sent = False
    status = 500
    parts: list[bytes] = []
    size = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            part = bytes(message.get("body", b""))
            size += len(part)
            if size <= MAX_ANSWER:  # beyond: dropped as it comes, never held
                parts.append(part)

    await app(scope, receive, send)
    if size > MAX_ANSWER:
        return 413, _error(f"the answer is over {MAX_ANSWER} bytes, more than a relayed call holds")
    return status, b"".join(parts)
