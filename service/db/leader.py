"""Leadership for the background loops: a Postgres session advisory lock on one connection.

The lock lives exactly as long as that connection. Losing the connection means losing
leadership, so `watch()` raises as soon as a ping fails and the supervisor cancels the loops.
A database that cannot be reached to take the lock is `Unavailable`, as everywhere else.
The lock is an efficiency measure, not what makes loops correct: every loop write is fenced in
SQL (state and epoch conditions), so two leaders overlapping briefly does no harm.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import structlog

from service.core.errors import Unavailable
from service.db.engine import UNAVAILABLE, plain_url

log = structlog.get_logger(__name__)

LOOPS_LOCK_KEY = 0x6265727400000001  # fixed forever; never derive it at runtime

# A ping or a close on the lock's connection: it is gone (UNAVAILABLE, a dead peer's
# TimeoutError among them), or Postgres ended the session (idle_session_timeout, an admin's
# pg_terminate_backend, a shutdown: the "operator intervention" class, SQLSTATE 57).
_CONNECTION_ENDED = (
    *UNAVAILABLE,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
)


class LeadershipLost(Exception):
    pass


class Leader:
    def __init__(self, url: str, *, retry_seconds: float = 1.0, ping_seconds: float = 1.0) -> None:
        self._url = url
        self._retry = retry_seconds
        self._ping = ping_seconds
        self._conn: asyncpg.Connection | None = None
        self._leading = False

    @contextlib.asynccontextmanager
    async def held(self, stop: asyncio.Event) -> AsyncIterator["Leader"]:
        """Wait until this server holds the lock (or `stop`); release it on exit."""
        try:
            conn = await asyncpg.connect(plain_url(self._url), timeout=5)
        except (*_CONNECTION_ENDED, asyncpg.exceptions.TooManyConnectionsError) as exc:
            raise Unavailable(f"cannot reach the database to lead: {exc}") from exc
        try:
            self._leading = await self._acquire(conn, stop)
            self._conn = conn
            yield self
        finally:
            self._conn = None
            self._leading = False
            with contextlib.suppress(*_CONNECTION_ENDED):  # a dead one has released it already
                await conn.close(timeout=2)

    async def _acquire(self, conn: asyncpg.Connection, stop: asyncio.Event) -> bool:
        """Take the lock on `conn`: True once held, False when `stop` came first."""
        # A leader that stops pinging (frozen, partitioned) must lose the lock even though its
        # TCP connection looks alive: Postgres ends a session idle this long, releasing it.
        idle_ms = int(max(self._ping * 5, 2.0) * 1000)
        try:
            await conn.execute(f"SET idle_session_timeout = {idle_ms}")
            while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOOPS_LOCK_KEY):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._retry)
                if stop.is_set():
                    return False
        except _CONNECTION_ENDED as exc:
            raise Unavailable(f"lost the database while waiting to lead: {exc}") from exc
        log.info("leader_acquired")
        return True

    def holds(self) -> bool:
        """This server holds the lock now (and runs the loops)."""
        return self._leading

    async def watch(self, stop: asyncio.Event) -> None:
        """Return when `stop` is set; raise LeadershipLost when the lock's connection dies."""
        conn = self._conn
        assert conn is not None, "watch() only inside held()"
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._ping)
            if stop.is_set():
                return
            try:
                await conn.fetchval("SELECT 1", timeout=self._ping * 2)
            except _CONNECTION_ENDED as exc:
                raise LeadershipLost from exc
