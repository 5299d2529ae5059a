"""GET /api/v1/jobs/{id}/exec (websocket): a command beside a running job (docs/api.md).

The client's first message (text, JSON) asks: {"command": [...], "tty": bool, "rows": N,
"cols": N}; an empty command is the job's shell. The server answers {"type": "started"} or
{"type": "error", "error": ..., "status": N} and closes (code 4000 + N). Then binary messages
are the command's stdin one way and its output the other (first byte 1: stdout, 2: stderr);
text messages control it: {"eof": true}, {"rows": N, "cols": N}, {"signal": "INT"}. The last
message is {"type": "exit", "exit_code": N, "error": ...}.

Authentication happens in the handler, after the upgrade, so that a refusal reaches the client
as a message it can print (the reason, and the status an HTTP call would have had).
"""

import asyncio
import contextlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import structlog
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect
from litestar.params import FromPath

from service import protocol
from service.api import body
from service.api.channel.execs import Relayed
from service.api.identity import identify, request_id, runtime_of
from service.api.runtime import Runtime
from service.auth.callers import Caller
from service.auth.permissions import Perm, allowed
from service.core.errors import BerthError, Forbidden, Invalid, NotFound, Unavailable
from service.domain import execs
from service.domain.execs import Target

log = structlog.get_logger(__name__)

PATH = "/api/v1/jobs/{job_id:int}/exec"
ASK_TIMEOUT = 30.0  # seconds a client has to say what to run
EXIT_WAIT = 5.0  # seconds a gone client's exec has to report its exit (for the audit)
STDOUT, STDERR = 1, 2
Size = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class Ask(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    command: Annotated[list[body.Arg], msgspec.Meta(max_length=4096)] = msgspec.field(
        default_factory=list
    )
    tty: bool = False
    rows: Size = 0
    cols: Size = 0


class Control(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    eof: bool = False
    rows: Size = 0
    cols: Size = 0
    signal: Literal["", "INT", "TERM", "HUP", "QUIT", "KILL"] = ""


def _policy(rt: Runtime) -> Callable[[str], str]:
    """A pool's `exec` setting as in force now (a pool berth.toml lacks: the default)."""

    def policy_of(pool: str) -> str:
        pools = rt.effective.pools
        return pools[pool].exec if pool in pools else "operator"

    return policy_of


@websocket(PATH, opt={"perm": Perm.JOBS_EXEC, "auth_in_handler": True})
async def exec_session(socket: WebSocket[Any, Any, Any], job_id: FromPath[int]) -> None:
    """Relay one exec between the client and the job's worker, then audit how it ended."""
    rt = runtime_of(socket)
    await socket.accept()
    try:
        caller, target, ask, relayed = await _open(socket, rt, job_id)
    except BerthError as exc:
        await _refuse(socket, exc)
        return
    except (TimeoutError, WebSocketDisconnect):
        return
    hub = rt.hub
    try:
        exit_code, error = await _relay(socket, target, ask, relayed)
    finally:
        hub.execs.close(relayed)
    log.info("exec_ended", job=job_id, exec=relayed.id, exit_code=exit_code, error=error)
    try:
        async with hub.execs.db_turns:
            await execs.ended(
                rt.db,
                caller,
                target,
                session=relayed.id,
                exit_code=exit_code,
                error=error,
                request_id=request_id(socket),
            )
    except BerthError as exc:  # the database is away: the opening entry stands alone
        log.warning("exec_end_not_audited", job=job_id, exec=relayed.id, error=exc.message)
    with contextlib.suppress(Exception):
        await socket.close()


async def _open(
    socket: WebSocket[Any, Any, Any], rt: Runtime, job_id: int
) -> tuple[Caller, Target, Ask, Relayed]:
    caller = await identify(socket)
    if not allowed(caller, Perm.JOBS_EXEC):
        raise Forbidden("you may not do this")
    if not 1 <= job_id <= 2**63 - 1:
        raise NotFound(f"no job {job_id}")
    raw = await asyncio.wait_for(socket.receive_text(), timeout=ASK_TIMEOUT)
    try:
        ask = msgspec.json.decode(raw, type=Ask)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Invalid(f"bad exec request: {exc}") from None
    hub = rt.hub
    async with hub.execs.db_turns:
        target = await execs.admit(rt.db, caller, job_id, _policy(rt))
        session = hub.sessions.get(target.worker_id)
        if session is None or session.closed:
            raise Unavailable(
                f"job {job_id}'s worker is not attached to this server right now (it may be "
                "reconnecting, or attached to another server of this installation); try again"
            )
        relayed = hub.execs.open(session)
        try:
            await execs.opened(
                rt.db,
                caller,
                target,
                ask.command,
                tty=ask.tty,
                session=relayed.id,
                request_id=request_id(socket),
            )
        except BaseException:
            hub.execs.close(relayed)
            raise
    log.info("exec_opened", job=job_id, exec=relayed.id, worker=session.worker.name)
    return caller, target, ask, relayed


async def _refuse(socket: WebSocket[Any, Any, Any], exc: BerthError) -> None:
    with contextlib.suppress(Exception):
        await socket.send_json({"type": "error", "error": exc.message, "status": exc.status})
        await socket.close(code=4000 + exc.status, reason=exc.message[:120])


async def _relay(
    socket: WebSocket[Any, Any, Any], target: Target, ask: Ask, relayed: Relayed
) -> tuple[int | None, str]:
    """Pump both ways until the command exits (or the client leaves); its exit code."""
    sent = relayed.session.send(
        protocol.ExecStart(
            exec=relayed.id,
            job=target.job.id,
            epoch=target.epoch,
            command=tuple(ask.command),
            tty=ask.tty,
            rows=ask.rows,
            cols=ask.cols,
        )
    )
    if not sent:
        await _refuse(socket, Unavailable("the job's worker lost its connection; try again"))
        return None, "the job's worker lost its connection before the command started"
    await socket.send_json({"type": "started", "session": relayed.id})
    inbound = asyncio.create_task(_from_client(socket, relayed))
    outbound = asyncio.create_task(_to_client(socket, relayed))
    done, _ = await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
    if outbound not in done:  # the client left: stop the command, wait a little for its exit
        relayed.session.send(protocol.ExecInput(exec=relayed.id, signal="KILL"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(outbound), timeout=EXIT_WAIT)
    inbound.cancel()
    outbound.cancel()
    results = await asyncio.gather(inbound, outbound, return_exceptions=True)
    ended = results[1]
    if isinstance(ended, tuple):
        return ended
    return None, "the client left before the command's exit was known"


async def _to_client(socket: WebSocket[Any, Any, Any], relayed: Relayed) -> tuple[int | None, str]:
    client_here = True
    while True:
        frame = await relayed.frames.get()
        match frame:
            case protocol.ExecOutput():
                if client_here:
                    try:
                        prefix = STDOUT if frame.stream == "stdout" else STDERR
                        await socket.send_bytes(bytes([prefix]) + frame.data)
                    except Exception:  # the client is gone: keep draining to learn the exit
                        client_here = False
                relayed.session.send(protocol.ExecDelivered(exec=relayed.id))
            case protocol.ExecTaken():
                with contextlib.suppress(ValueError):
                    relayed.credit.release()
            case protocol.ExecExit():
                if client_here:
                    with contextlib.suppress(Exception):
                        await socket.send_json(
                            {"type": "exit", "exit_code": frame.exit_code, "error": frame.error}
                        )
                return frame.exit_code, frame.error


async def _from_client(socket: WebSocket[Any, Any, Any], relayed: Relayed) -> None:
    """Client messages to the worker, each waiting for room in the exec's window."""
    while True:
        try:
            message = await socket.receive()
        except WebSocketDisconnect:
            return
        if message["type"] == "websocket.disconnect":
            return
        data, text = message.get("bytes"), message.get("text")
        if isinstance(data, bytes) and data:
            for at in range(0, len(data), protocol.EXEC_CHUNK):
                await _to_worker(
                    relayed,
                    protocol.ExecInput(exec=relayed.id, data=data[at : at + protocol.EXEC_CHUNK]),
                )
        elif isinstance(text, str) and text:
            try:
                c = msgspec.json.decode(text, type=Control)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                await socket.send_json({"type": "warning", "error": f"bad control: {exc}"})
                continue
            await _to_worker(
                relayed,
                protocol.ExecInput(
                    exec=relayed.id, eof=c.eof, rows=c.rows, cols=c.cols, signal=c.signal
                ),
            )


async def _to_worker(relayed: Relayed, frame: protocol.ExecInput) -> None:
    await relayed.credit.acquire()
    relayed.session.send(frame)
