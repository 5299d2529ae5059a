"""The worker channel of one server, put together: sessions, dispatcher, beats, reports, notices.

Each part is its own module and task, and is given only what it uses; the hub only wires them
and runs them together. Nothing here knows the runtime or the app (api/assembly.py builds the
hub before either exists).
"""

import asyncio
from collections.abc import Callable

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
from service.api.limits_watch import InForceHere
from service.config import Executor
from service.core.errors import BerthError
from service.db.engine import Database
from service.domain import leasing
from service.metrics import Metrics
from service.tasks import spawn

log = structlog.get_logger(__name__)


class Hub:
    def __init__(  # noqa: PLR0917  (one call site: api/assembly.py)
        self,
        db: Database,
        server_id: str,
        executor: Executor,
        in_force: InForceHere,
        secret_key: bytes,
        forget_caller: Callable[[str], None],
        metrics: Metrics,
    ) -> None:
        self.db = db
        self.metrics = metrics
        self.relay_max_in_flight = executor.relay_max_in_flight
        self.sessions = Sessions()
        self.dispatcher = Dispatcher(
            db,
            self.sessions,
            pools=lambda: in_force.pools,
            quotas=lambda: in_force.quotas,
            secret_key=secret_key,
            fallback_seconds=executor.dispatch_fallback_seconds,
            metrics=metrics,
        )
        self.beats = Heartbeats(db, server_id=server_id, metrics=metrics)
        self.notices = Notices(
            db,
            self.sessions,
            executor=executor,
            poke=self.dispatcher.poke,
            forget_caller=forget_caller,
        )
        self.reports = ReportBatcher(
            db, in_force=lambda: in_force.effective, on_freed=self._freed, metrics=metrics
        )
        self.credentials = Credentials(
            db, rotate_hours=executor.credential_rotate_hours, forget_caller=forget_caller
        )
        self.execs = ExecRelays()  # `berth job exec` sessions through this server

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
        bound = self.relay_max_in_flight
        if session.relays >= bound:
            session.send(relay.too_many(ask, bound))
            return
        session.relays += 1
        spawn(self._relay(session, ask), name=f"relay-{session.worker.name}")

    async def _relay(self, session: Session, ask: protocol.RelayRequest) -> None:
        try:
            with self.metrics.relay_sessions.track_inprogress():
                await relay.answer(self.db, session, ask)
        finally:
            session.relays -= 1

    def bye(self, session: Session, frame: protocol.Bye) -> None:
        """A stopping worker gave its leases back: free them now (its copies are dead)."""
        session.left = True
        spawn(self._release(session, frame.released), name=f"release-{session.worker.name}")

    async def _release(self, session: Session, released: tuple[tuple[int, int], ...]) -> None:
        try:
            freed = await leasing.release(self.db, session.worker, released)
        except BerthError as exc:  # the silence window frees them instead
            log.warning("release_failed", worker=session.worker.name, error=exc.message)
            return
        log.info("worker_left", worker=session.worker.name, released=freed)
        self.poke()
