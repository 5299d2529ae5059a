"""GET /api/v1/workers/attach: the worker websocket.

hello -> welcome (or refused + close); then beats are acked, leases are sent, and every report
is checked against the live lease: a stale one is answered with `stale`, and the worker kills
that copy. Authentication happens here rather than in the guard so that a refused worker is
told why in a frame it can print. A frame outside the protocol's bounds is refused the same
way, naming the field, and the socket is closed: nothing of it reaches the database.
"""

import asyncio
import contextlib
from typing import Any

import msgspec
import structlog
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

from service import protocol
from service.api.channel.hub import Hub
from service.api.channel.session import SOCKET_GONE, Session
from service.api.identity import bearer, identify, runtime_of
from service.api.runtime import Runtime
from service.auth.permissions import Perm, allowed
from service.core.errors import BerthError
from service.domain import joining, leasing
from service.domain.artifacts import server_store
from service.tasks import spawn

log = structlog.get_logger(__name__)

HELLO_TIMEOUT = 10.0


class _Version(msgspec.Struct):
    """Just enough of any hello to tell a worker of another protocol version what is wrong."""

    protocol: int = 0


class BadFrame(Exception):
    """A frame that does not decode within the protocol's bounds."""


def _decode(raw: str | bytes) -> protocol.ToServer:
    try:
        return protocol.decode_to_server(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadFrame(f"bad frame: {exc}") from None


@websocket(protocol.WORKER_PATH, opt={"perm": Perm.WORKER_PROTOCOL, "auth_in_handler": True})
async def attach(socket: WebSocket[Any, Any, Any]) -> None:
    rt = runtime_of(socket)
    hub = rt.hub
    await socket.accept()
    try:
        attached, credential = await _admit(socket, rt)
    except (BerthError, BadFrame, msgspec.ValidationError, msgspec.DecodeError) as exc:
        reason = exc.message if isinstance(exc, BerthError) else str(exc)
        if isinstance(exc, msgspec.MsgspecError):
            reason = f"bad hello: {exc}"
        await _refuse(socket, reason)
        return
    except (TimeoutError, WebSocketDisconnect):
        with contextlib.suppress(*SOCKET_GONE):
            await socket.close(code=4002)
        return
    session = Session(worker=attached.worker, socket=socket)
    with contextlib.suppress(*SOCKET_GONE):
        await socket.send_text(protocol.encode(_welcome(rt, attached)).decode())
    session.start()
    if credential:  # joined: the worker stores its own credential now
        session.send(protocol.Credential(token=credential))
    hub.add(session)
    structlog.contextvars.bind_contextvars(worker=attached.worker.name)
    rotation = spawn(
        hub.credentials.rotate_when_due(session), name=f"rotate-{attached.worker.name}"
    )
    try:
        await _serve(session, hub)
    except BadFrame as exc:
        log.warning("worker_bad_frame", reason=str(exc))
        session.send(protocol.Refused(reason=str(exc)))
        await session.close(4001, str(exc))
    finally:
        rotation.cancel()
        await session.stop()
        hub.execs.worker_gone(session)  # after stop: no exec opens on a closed session
        if hub.remove(session):
            with contextlib.suppress(BerthError):  # the silence window detaches it instead
                await leasing.detach(
                    rt.db, worker_id=session.worker.id, server_id=rt.server_id, gone=session.left
                )
        hub.poke()
        log.info("worker_detached", worker=session.worker.name, left=session.left)


async def _admit(socket: WebSocket[Any, Any, Any], rt: Runtime) -> tuple[leasing.Attached, str]:
    """Who it is, its hello, and its admission; raise with the reason it is refused.

    Returns the attachment and, after a join, the credential the worker is to store.
    """
    credential = ""
    presented = bearer(socket)
    if joining.looks_like(presented):
        if rt.config.network.auth == "proxy":
            raise leasing.Refusal(
                "join tokens are for token mode; behind a proxy, workers use the shared credential"
            )
        caller, credential = await joining.trade(rt.db, presented)
    else:
        caller = await identify(socket)
    if not allowed(caller, Perm.WORKER_PROTOCOL):
        raise leasing.Refusal("this credential is not a worker's")
    raw = await asyncio.wait_for(socket.receive_text(), timeout=HELLO_TIMEOUT)
    version = msgspec.json.decode(raw, type=_Version).protocol
    if version != protocol.PROTOCOL_VERSION:
        raise leasing.Refusal(
            f"protocol {version} is not the server's ({protocol.PROTOCOL_VERSION}); "
            "install the server's berth version"
        )
    hello = _decode(raw)
    if not isinstance(hello, protocol.Hello):
        raise leasing.Refusal("the first frame must be hello")
    store_id = rt.cas_access.id if rt.cas_access is not None else ""
    attached = await leasing.attach(
        rt.db, caller, hello, server_id=rt.server_id, pools=rt.pools, store_id=store_id
    )
    return attached, credential


def _welcome(rt: Runtime, attached: leasing.Attached) -> protocol.Welcome:
    ex = rt.config.executor
    return protocol.Welcome(
        name=attached.worker.name,
        heartbeat_seconds=ex.heartbeat_seconds,
        unreachable_seconds=ex.unreachable_seconds,
        evict_seconds=ex.evict_seconds,
        kill_grace_seconds=ex.kill_grace_seconds,
        drop=attached.drop,
        pool=attached.worker.pool,
        labels=tuple(attached.worker.labels),
        cas=server_store.for_worker(rt.cas_access, attached.worker.tenants)
        if rt.cas_access is not None
        else None,
        relay_max_save_gb=ex.relay_max_save_gb,
    )


async def _refuse(socket: WebSocket[Any, Any, Any], reason: str) -> None:
    log.warning("worker_refused", reason=reason)
    with contextlib.suppress(*SOCKET_GONE):
        await socket.send_text(protocol.encode(protocol.Refused(reason=reason)).decode())
        await socket.close(code=4001, reason=reason[:120])


async def _serve(session: Session, hub: Hub) -> None:
    """Pump frames until the socket closes; raise BadFrame for one outside the protocol."""
    while not session.closed:
        try:
            raw = await session.socket.receive_text()
        except (WebSocketDisconnect, RuntimeError):
            return
        frame = _decode(raw)
        if session.revoked:
            # Security: a revoked credential's reports are not results; only its bye, which
            # gives back the leases of the copies it killed, is taken.
            if isinstance(frame, protocol.Bye):
                hub.bye(session, frame)
                await session.close(4003, "revoked")
            continue
        match frame:
            case protocol.Beat() as beat:
                hub.beats.add(session, beat)
            case (
                protocol.Started()
                | protocol.Output()
                | protocol.Finished()
                | protocol.GaveBack()
                | protocol.Metrics()
                | protocol.Saved()
            ) as report:
                hub.reports.add(session, report)
            case protocol.RelayRequest() as ask:
                hub.relay(session, ask)
            case protocol.ExecOutput() | protocol.ExecExit() | protocol.ExecTaken() as answer:
                hub.execs.deliver(session, answer)
            case protocol.Bye() as bye:
                hub.bye(session, bye)
            case protocol.CredentialStored():
                hub.credentials.stored(session)
            case protocol.Hello():
                raise BadFrame("bad frame: hello was already said on this connection")
