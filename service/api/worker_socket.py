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
from service.api.hub import Hub, Session
from service.api.identity import identify, runtime_of
from service.auth.permissions import Perm, allowed
from service.core.errors import BerthError
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
    try:
        await _serve(session, rt)
    finally:
        if hub.remove(session):
            with contextlib.suppress(Exception):
                await leasing.detach(
                    rt.db, worker_id=session.worker.id, server_id=rt.server_id, gone=session.left
                )
        hub.poke()
        log.info("worker_detached", worker=session.worker.name, left=session.left)


async def _serve(session: Session, rt: Any) -> None:  # noqa: ANN401  (Runtime; avoids a cycle)
    """Pump frames until the socket closes."""
    hub = rt.the_hub()
    while not session.closed:
        try:
            raw = await session.socket.receive_text()
        except (WebSocketDisconnect, RuntimeError):
            return
        try:
            frame = protocol.decode_to_server(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("worker_bad_frame", error=str(exc))
            continue
        _handle(session, hub, frame)


def _handle(session: Session, hub: Hub, frame: protocol.ToServer) -> None:
    """Beats and reports go to the hub's batches; their answers come after the flush commits."""
    match frame:
        case protocol.Beat():
            hub.beat(session, frame)
        case protocol.Started() | protocol.Output() | protocol.Finished():
            hub.report(session, frame)
        case protocol.Bye():
            hub.bye(session, frame)
        case protocol.Hello():
            log.warning("worker_hello_again")
