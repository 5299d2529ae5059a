"""A worker in the test's own process: `service.protocol` frames over the ASGI websocket.

The app runs on the test's event loop (as the in-process API tests do), so the channel, its
hub and the test share one database pool and one clock, and no port, process or thread is
involved. The fake worker says hello with a real credential, receives leases, sends beats and
reports, and can go silent (stop beating and reading, the socket still up, as a frozen worker),
vanish (the socket drops without a bye, as after kill -9) or misbehave (any raw text).

`running(api)` starts what `berth serve` runs beside the app for the channel: the hub's
dispatcher, beat and report flushers, and LISTEN on the test's database, so a cancel or a revoke
reaches the worker's session the way it does in production. The leader's loops do not run: a
test calls what they call (`leasing.expire_silent`) itself, with the windows it wants.
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from service import protocol
from service.db import notify
from service.db.queries.jobs import JOBS_CHANNEL
from service.db.queries.workers import WORKERS_CHANNEL

F = TypeVar("F", bound=protocol.Frame)
WAIT = 10.0  # seconds any one expected frame may take on a loaded machine


class Closed(Exception):
    """The server closed the socket: `code` and `reason` as it said them."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"closed {code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass
class Socket:
    """The client end of one ASGI websocket to `app`, driven on this event loop."""

    app: Any
    path: str
    headers: dict[str, str]
    _to_app: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    _from_app: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None
    _reading: asyncio.Event = field(default_factory=asyncio.Event)
    closed: Closed | None = None

    async def open(self) -> None:
        """Connect; raise Closed when the app refuses the upgrade itself."""
        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "scheme": "ws",
            "server": ("berth.test", 80),
            "client": ("127.0.0.1", 40000),
            "root_path": "",
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "headers": [(b"host", b"berth.test")]
            + [(k.lower().encode(), v.encode()) for k, v in self.headers.items()],
            "subprotocols": [],
            "state": {},
            "extensions": {},
        }
        self._reading.set()
        self._to_app.put_nowait({"type": "websocket.connect"})
        self._task = asyncio.create_task(self._run(scope), name=f"fake-ws-{self.path}")
        first = await self._next()
        if first["type"] != "websocket.accept":
            raise self._close_of(first)

    async def _run(self, scope: dict[str, Any]) -> None:
        async def send(message: dict[str, Any]) -> None:
            # A client that stopped reading: the server's write waits, as on full TCP buffers.
            await self._reading.wait()
            await self._from_app.put(message)
            if message["type"] == "websocket.close":  # as a server would: the peer is gone
                self._to_app.put_nowait(
                    {"type": "websocket.disconnect", "code": message.get("code", 1000)}
                )

        try:
            await self.app(scope, self._to_app.get, send)
        finally:  # however the handler ended, the client sees the socket end
            self._from_app.put_nowait({"type": "websocket.close", "code": 1006, "reason": ""})

    async def _next(self) -> dict[str, Any]:
        return await asyncio.wait_for(self._from_app.get(), timeout=WAIT)

    def _close_of(self, message: dict[str, Any]) -> Closed:
        self.closed = self.closed or Closed(
            int(message.get("code", 1000)), str(message.get("reason", ""))
        )
        return self.closed

    async def receive_text(self) -> str:
        """The next text frame; raise Closed once the server closed the socket."""
        if self.closed is not None:
            raise self.closed
        message = await self._next()
        if message["type"] == "websocket.send":
            return str(message.get("text") or message.get("bytes", b"").decode())
        raise self._close_of(message)

    def pending(self) -> int:
        """Frames the server sent that were not read yet."""
        return self._from_app.qsize()

    def stop_reading(self) -> None:
        """From now on the server's writes to this socket wait (it still takes our frames)."""
        self._reading.clear()

    def send_text(self, text: str) -> None:
        self._to_app.put_nowait({"type": "websocket.receive", "text": text})

    async def disconnect(self, code: int = 1000) -> None:
        """The client end goes away (1006: dropped, as a killed process's socket)."""
        self._to_app.put_nowait({"type": "websocket.disconnect", "code": code})
        self._reading.set()  # the app's last writes go nowhere rather than wait forever
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, timeout=WAIT)


@dataclass
class FakeWorker:
    """One worker process as the server sees it: a credential, a hello, then frames."""

    app: Any
    headers: dict[str, str]
    pool: str | None = "gpu"
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    held: tuple[tuple[int, int], ...] = ()
    welcome: protocol.Welcome | None = None
    seen: list[protocol.ToWorker] = field(default_factory=list)  # read but not yet asked for
    socket: Socket | None = None
    _seq: int = 0

    @classmethod
    def with_token(cls, app: Any, token: str, **kw: Any) -> "FakeWorker":
        return cls(app=app, headers={"Authorization": f"Bearer {token}"}, **kw)

    def hello(self) -> protocol.Hello:
        return protocol.Hello(
            protocol=protocol.PROTOCOL_VERSION,
            berth_version="test",
            pool=self.pool,
            instance=self.instance,
            held=self.held,
        )

    async def connect(self, first: str | None = None) -> protocol.Welcome:
        """Dial and say hello (or `first`, raw); the welcome, or raise Refused-as-Closed."""
        self.socket = Socket(self.app, protocol.WORKER_PATH, self.headers)
        await self.socket.open()
        self.socket.send_text(
            first if first is not None else protocol.encode(self.hello()).decode()
        )
        frame = await self._read()
        if isinstance(frame, protocol.Refused):
            raise Refused(frame.reason, await self.closed())
        assert isinstance(frame, protocol.Welcome), frame
        self.welcome = frame
        return frame

    async def _read(self) -> protocol.ToWorker:
        assert self.socket is not None, "connect first"
        return protocol.decode_to_worker(await self.socket.receive_text())

    async def next(
        self, kind: type[F], where: Callable[[F], bool] = lambda _: True, *, timeout: float = WAIT
    ) -> F:
        """The next frame of `kind` that `where` accepts (others stay in `seen`, in order)."""
        for i, frame in enumerate(self.seen):
            if isinstance(frame, kind) and where(frame):
                del self.seen[i]
                return frame
        async with asyncio.timeout(timeout):
            while True:
                frame = await self._read()
                if isinstance(frame, kind) and where(frame):
                    return frame
                self.seen.append(frame)

    async def lease(self, *, timeout: float = WAIT) -> protocol.Lease:
        """The next lease, whether it came alone or in a `leases` frame."""
        for i, frame in enumerate(self.seen):
            if isinstance(frame, protocol.Leases):
                self.seen[i : i + 1] = list(frame.leases)
        async with asyncio.timeout(timeout):
            while True:
                for i, frame in enumerate(self.seen):
                    if isinstance(frame, protocol.Lease):
                        del self.seen[i]
                        return frame
                got = await self._read()
                self.seen.extend(got.leases if isinstance(got, protocol.Leases) else (got,))

    async def closed(self) -> Closed:
        """Read until the server closes the socket; how it closed."""
        while True:
            try:
                self.seen.append(await self._read())
            except Closed as done:
                return done

    def send_raw(self, text: str) -> None:
        assert self.socket is not None, "connect first"
        self.socket.send_text(text)

    def send(self, frame: protocol.Frame) -> None:
        self.send_raw(protocol.encode(frame).decode())

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def beat(self) -> protocol.Ack:
        """One heartbeat, and its ack (sent once the beat is in the database)."""
        seq = self.next_seq()
        self.send(protocol.Beat(seq=seq, host=protocol.Host()))
        return await self.next(protocol.Ack, lambda ack: ack.seq == seq)

    async def report(self, frame: protocol.Report) -> None:
        """Send a report and wait until the server says it is applied (or refused as stale)."""
        self.send(frame)
        await self.next(protocol.Received, lambda received: received.upto >= frame.seq)

    async def vanish(self) -> None:
        """The socket drops without a bye (kill -9 of the worker)."""
        assert self.socket is not None
        await self.socket.disconnect(1006)

    async def leave(self, released: tuple[tuple[int, int], ...] = ()) -> None:
        """Say bye (its copies killed) and close, as a worker stopped with SIGTERM."""
        self.send(protocol.Bye(released=released))
        assert self.socket is not None
        await self.socket.disconnect(1000)


class Refused(Exception):
    """The server answered `refused` and closed the socket."""

    def __init__(self, reason: str, closed: Closed) -> None:
        super().__init__(reason)
        self.reason = reason
        self.closed = closed


@contextlib.asynccontextmanager
async def running(api: Any, db_url: str) -> AsyncIterator[None]:
    """Run the hub and LISTEN beside the in-process app `api` (tests.integration.conftest.Api)
    until the block ends, as `berth serve` does beside its HTTP server."""
    hub = api.rt.hub
    stop = asyncio.Event()
    listening = asyncio.Event()
    handlers: dict[str, Callable[[str], Awaitable[None] | None]] = {
        JOBS_CHANNEL: lambda _p: hub.poke(),
        WORKERS_CHANNEL: hub.on_worker_notice,
    }
    tasks = [
        asyncio.create_task(hub.run(stop), name="hub"),
        asyncio.create_task(notify.listen(db_url, handlers, stop, ready=listening), name="listen"),
    ]
    try:
        await asyncio.wait_for(listening.wait(), timeout=WAIT)
        yield
    finally:
        stop.set()
        for session in list(hub.sessions):  # (one a test left not reading is dropped)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.close(1001, "test over"), timeout=WAIT)
        # The flushers look at `stop` between waits of up to a second: a test need not wait.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT) -> None:
    """Wait for a condition (each check a query or a call), never for a fixed time."""
    try:
        async with asyncio.timeout(timeout):
            while not await predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
