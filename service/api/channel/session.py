"""One attached worker's websocket, and the registry of those attached to this server.

Frames to a worker go through its own queue and sender task, so a worker whose socket stops
reading blocks only its own sender: acks and leases to every other worker go on. A queue that
fills up means the worker is not reading; it is cut off and may dial again.
"""

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from litestar.connection import WebSocket
from litestar.exceptions import WebSocketDisconnect

from service import protocol
from service.db.records import WorkerRecord
from service.tasks import spawn

log = structlog.get_logger(__name__)

# What sending on a socket that went away raises: Litestar's disconnect, uvicorn's
# ClientDisconnected (an OSError), and the ASGI server's refusal of a message after close.
SOCKET_GONE = (WebSocketDisconnect, OSError, RuntimeError)
SEND_QUEUE = 4096  # frames waiting for one worker before it counts as not reading
CLOSE_FLUSH = 1.0  # seconds a closing session may take to send what is queued (exit, refusal)


@dataclass(eq=False)
class Session:
    worker: WorkerRecord
    socket: WebSocket[Any, Any, Any]
    closed: bool = False
    left: bool = False  # it said bye: it stopped on purpose
    revoked: bool = False  # its credential was revoked: only its bye is taken now
    relays: int = 0  # its jobs' relayed calls being answered now ([executor] relay_max_in_flight)
    _queue: asyncio.Queue[protocol.Frame] = field(
        default_factory=lambda: asyncio.Queue(maxsize=SEND_QUEUE)
    )
    _sender: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start this session's sender task (after the welcome went out)."""
        self._sender = asyncio.create_task(self._send_loop(), name=f"send-{self.worker.name}")

    def send(self, frame: protocol.Frame) -> bool:
        """Queue a frame; never waits. False when the session is closed or cut off as too slow."""
        if self.closed:
            return False
        try:
            self._queue.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning("worker_not_reading", worker=self.worker.name, queued=SEND_QUEUE)
            self.closed = True
            spawn(self._close_socket(4008, "not reading"), name=f"cut-{self.worker.name}")
            return False
        return True

    def close_soon(self, code: int, reason: str) -> None:
        """`close` on a task of its own: a caller serving many workers never waits on one."""
        spawn(self.close(code, reason), name=f"close-{self.worker.name}")

    def close_later(self, delay: float, code: int, reason: str) -> None:
        """Close after `delay` seconds unless the socket ends first."""

        async def later() -> None:
            await asyncio.sleep(delay)
            await self.close(code, reason)

        spawn(later(), name=f"close-later-{self.worker.name}")

    async def _send_loop(self) -> None:
        while True:
            frame = await self._queue.get()
            text = protocol.encode(frame).decode()
            try:
                await self.socket.send_text(text)
            except SOCKET_GONE:  # the reader loop cleans up
                self.closed = True
                return
            finally:
                self._queue.task_done()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close after sending what is queued (bounded: a worker not reading gets no wait)."""
        if self._sender is not None and not self._sender.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout=CLOSE_FLUSH)
        self.closed = True
        await self._close_socket(code, reason)

    async def _close_socket(self, code: int, reason: str) -> None:
        with contextlib.suppress(*SOCKET_GONE):
            await self.socket.close(code=code, reason=reason[:120])

    async def stop(self) -> None:
        """The socket is gone: end the sender task."""
        self.closed = True
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.wait([self._sender])
            # Not raised here: the caller is tidying up a gone socket and must finish that.
            if not self._sender.cancelled() and (exc := self._sender.exception()) is not None:
                log.error("worker_sender_failed", worker=self.worker.name, exc_info=exc)


class Sessions:
    """The workers attached to this server, by worker id."""

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}

    def add(self, session: Session) -> None:
        old = self._by_id.get(session.worker.id)
        self._by_id[session.worker.id] = session
        if old is not None and old is not session:  # the same worker dialled again
            old.closed = True

    def remove(self, session: Session) -> bool:
        """Forget a session; False when a newer one of the same worker replaced it."""
        if self._by_id.get(session.worker.id) is session:
            del self._by_id[session.worker.id]
            return True
        return False

    def get(self, worker_id: str) -> Session | None:
        return self._by_id.get(worker_id)

    def by_name(self, name: str) -> Session | None:
        return next((s for s in self._by_id.values() if s.worker.name == name), None)

    def ids(self) -> list[str]:
        return list(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))
