"""The worker channel of one server, put together: sessions, dispatcher, beats, reports, notices.

Each part is its own module and task; the hub only wires them and runs them together.
"""

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from service import protocol
from service.api.channel import relay
from service.api.channel.beats import Heartbeats
from service.api.channel.credentials import Credentials
from service.api.channel.dispatcher import Dispatcher
from service.api.channel.execs import ExecRelays
from service.api.channel.notices import Notices
from service.api.channel.reports import ReportBatcher
from service.api.channel.session import Session, Sessions
from service.api.runtime import Runtime
from service.core.errors import BerthError
from service.domain import leasing

log = structlog.get_logger(__name__)


class Hub:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.sessions = Sessions()
        self.dispatcher = Dispatcher(rt, self.sessions)
        self.beats = Heartbeats(rt)
        self.notices = Notices(rt, self.sessions, self.dispatcher.poke)
        self.reports = ReportBatcher(rt, self._freed)
        self.credentials = Credentials(rt)
        self.execs = ExecRelays()  # `berth job exec` sessions through this server
        self._tasks: set[asyncio.Future[None]] = set()

    def poke(self) -> None:
        self.dispatcher.poke()

    def add(self, session: Session) -> None:
        self.sessions.add(session)
        self.poke()

    def remove(self, session: Session) -> bool:
        return self.sessions.remove(session)

    async def on_worker_notice(self, payload: str) -> None:
        await self.notices.on_worker_notice(payload)

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatcher, heartbeat and report flushers until `stop`."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.dispatcher.run(stop), name="dispatcher")
            tg.create_task(self.beats.run(stop), name="heartbeats")
            tg.create_task(self.reports.run(stop), name="reports")

    async def _freed(self, sessions: list[Session]) -> None:
        self.poke()
        for session in sessions:
            await self.notices.exit_if_drained(session)

    def relay(self, session: Session, ask: protocol.RelayRequest) -> None:
        """A job's call, answered on its own task (it may take a while; the reader goes on).

        At most [executor] relay_max_in_flight of one session's calls at once: past it, the
        call is answered 429 at once, so jobs cannot make this server hold without end tasks
        (and database connections) for one worker; its beats and reports go on.
        """
        bound = self.rt.config.executor.relay_max_in_flight
        if session.relays >= bound:
            session.send(relay.too_many(ask, bound))
            return
        session.relays += 1
        self._spawn(self._relay(session, ask))

    async def _relay(self, session: Session, ask: protocol.RelayRequest) -> None:
        try:
            await relay.answer(self.rt, session, ask)
        finally:
            session.relays -= 1

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def bye(self, session: Session, frame: protocol.Bye) -> None:
        """A stopping worker gave its leases back: free them now (its copies are dead)."""
        session.left = True
        self._spawn(self._release(session, frame.released))

    async def _release(self, session: Session, released: tuple[tuple[int, int], ...]) -> None:
        try:
            freed = await leasing.release(self.rt.db, session.worker, released)
        except BerthError as exc:  # the silence window frees them instead
            log.warning("release_failed", worker=session.worker.name, error=exc.message)
            return
        log.info("worker_left", worker=session.worker.name, released=freed)
        self.poke()
