"""GET /api/v1/workers/attach: the worker websocket.

hello -> welcome (or refused + close); then beats are acked, leases are sent, and every report
is checked against the live lease: a stale one is answered with `stale`, and the worker kills
that copy. Authentication happens here rather than in the guard so that a refused worker is
told why in a frame it can print.
"""

import asyncio
import contextlib
from typing import Any

import msgspec
import structlog
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

from service import protocol
from service.api.hub import Session
from service.api.identity import identify, runtime_of
from service.auth.permissions import Perm, allowed
from service.core.errors import BerthError, StaleEpoch
from service.domain import leasing

log = structlog.get_logger(__name__)

HELLO_TIMEOUT = 10.0


@websocket(protocol.WORKER_PATH, opt={"perm": Perm.WORKER_PROTOCOL, "auth_in_handler": True})
async def attach(socket: WebSocket[Any, Any, Any]) -> None:
    rt = runtime_of(socket)
    hub = rt.the_hub()
    await socket.accept()
    try:
        caller = await identify(socket)
        if not allowed(caller, Perm.WORKER_PROTOCOL):
            raise leasing.Refusal("this credential is not a worker's")
        raw = await asyncio.wait_for(socket.receive_text(), timeout=HELLO_TIMEOUT)
        hello = protocol.decode_to_server(raw)
        if not isinstance(hello, protocol.Hello):
            raise leasing.Refusal("the first frame must be hello")
        attached = await leasing.attach(
            rt.db, caller, hello, server_id=rt.server_id, pools=rt.pools
        )
    except (BerthError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        reason = exc.message if isinstance(exc, BerthError) else f"bad hello: {exc}"
        log.warning("worker_refused", reason=reason)
        with contextlib.suppress(Exception):
            await socket.send_text(protocol.encode(protocol.Refused(reason=reason)).decode())
            await socket.close(code=4001, reason=reason[:120])
        return
    except (TimeoutError, WebSocketDisconnect):
        with contextlib.suppress(Exception):
            await socket.close(code=4002)
        return
    session = Session(worker=attached.worker, socket=socket)
    ex = rt.config.executor
    await session.send(
        protocol.Welcome(
            name=attached.worker.name,
            heartbeat_seconds=ex.heartbeat_seconds,
            unreachable_seconds=ex.unreachable_seconds,
            evict_seconds=ex.evict_seconds,
            kill_grace_seconds=ex.kill_grace_seconds,
            drop=attached.drop,
        )
    )
    hub.add(session)
    structlog.contextvars.bind_contextvars(worker=attached.worker.name)
    gone = False
    try:
        gone = await _serve(session, rt)
    finally:
        if hub.remove(session):
            with contextlib.suppress(Exception):
                await leasing.detach(
                    rt.db, worker_id=session.worker.id, server_id=rt.server_id, gone=gone
                )
        hub.poke()
        log.info("worker_detached", worker=session.worker.name, gone=gone)


async def _serve(session: Session, rt: Any) -> bool:  # noqa: ANN401  (Runtime; avoids a cycle)
    """Pump frames until the socket closes; True when the worker left on purpose."""
    hub = rt.the_hub()
    while not session.closed:
        try:
            raw = await session.socket.receive_text()
        except (WebSocketDisconnect, RuntimeError):
            return False
        try:
            frame = protocol.decode_to_server(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("worker_bad_frame", error=str(exc))
            continue
        await _handle(session, rt, hub, frame)
    return False


async def _handle(session: Session, rt: Any, hub: Any, frame: protocol.ToServer) -> None:  # noqa: ANN401
    db = rt.db
    try:
        match frame:
            case protocol.Beat():
                hub.beat(session, frame)
            case protocol.Started():
                await leasing.started(db, session.worker, frame)
            case protocol.Output():
                await leasing.output(
                    db, session.worker, frame.job, frame.epoch, [(frame.stream, frame.data)]
                )
            case protocol.Finished():
                await leasing.finished(db, session.worker, frame)
                await session.send(protocol.ResultAck(job=frame.job, epoch=frame.epoch))
                hub.poke()
                await hub.exit_if_drained(session)
            case protocol.Hello():
                log.warning("worker_hello_again")
    except StaleEpoch:
        job, epoch = frame.job, frame.epoch  # type: ignore[union-attr]
        await session.send(protocol.Stale(job=job, epoch=epoch))
    except BerthError as exc:  # e.g. the database is restarting: the worker resends results
        log.warning("worker_report_failed", error=exc.message, frame=type(frame).__name__)
