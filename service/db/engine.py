"""The Database: one async engine, one way to open a transaction, driver errors translated once.

`begin()` is the only way domain code writes: a transaction that commits on success and rolls
back on any exception. Driver errors become berth's own (Conflict, Unavailable) here, so the
API maps them to 4xx/503 in one place and never leaks a 500.
"""

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from sqlalchemy import event, make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.core import audit_chain
from service.core.errors import Conflict, Unavailable
from service.db.driver import DriverConnection

# A pooled connection idle longer than this is pinged before use (one round trip); one used
# more recently is not: a busy server would otherwise pay a ping per transaction (a fifth of a
# submit's round trips). A connection that died since is found by its first statement instead:
# that transaction fails as Unavailable (503, "retry shortly") and SQLAlchemy invalidates the
# whole pool on that disconnect, so the ones after it connect afresh.
PING_IDLE_SECONDS = 1.0
_IDLE_SINCE = "berth.idle_since"

# Where a transaction finds the key its audit entries are signed with (db/queries/audit.py).
AUDIT_KEY = "berth.audit_row_key"

# What the driver raises when Postgres is not reachable right now (down, restarting, the
# connection cut): translated to Unavailable, the one expected database failure.
UNAVAILABLE = (
    OSError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.InterfaceError,
    # The protocol out of step with its connection: what asyncpg raises when a backend that
    # was cut (a restart, pg_terminate_backend) is used before it noticed the socket closed.
    asyncpg.exceptions.InternalClientError,
)


def async_url(url: str) -> str:
    """postgresql://… -> postgresql+asyncpg://… (what SQLAlchemy's asyncpg dialect wants)."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"):
        u = u.set(drivername="postgresql+asyncpg")
    return u.render_as_string(hide_password=False)


def plain_url(url: str) -> str:
    """The libpq form of a URL (for asyncpg.connect and psql)."""
    u = make_url(url).set(drivername="postgresql")
    return u.render_as_string(hide_password=False)


def is_unavailable(exc: BaseException) -> bool:
    """True when the error means 'Postgres is not reachable right now', not a bad statement."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError):
        orig = getattr(exc.orig, "__cause__", None) or exc.orig
        return isinstance(orig, UNAVAILABLE) or bool(exc.connection_invalidated)
    return isinstance(exc, UNAVAILABLE)  # OSError covers ConnectionError and TimeoutError


# SQLSTATE classes of a refusal to let us in: connection exceptions, bad credentials, no such
# database. Anything else from the driver is a statement that failed, not a refusal.
_REFUSED_CLASSES = frozenset({"08", "28", "3D"})


def refusal(exc: BaseException) -> str | None:
    """What the database said when it would not let us in, or None for any other error."""
    if not isinstance(exc, DBAPIError):
        return None
    cause = getattr(exc.orig, "__cause__", None) or exc.orig
    if str(getattr(cause, "sqlstate", "") or "")[:2] in _REFUSED_CLASSES:
        return str(exc.orig)
    return None


class Database:
    """The engine plus berth's transaction pattern."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        max_overflow: int | None = None,
        secret_key: bytes | None = None,
    ) -> None:
        """An engine for `url`.

        `secret_key`: audit entries written through this database are signed with a key derived
        from it (the sealer chains only those); None signs nothing (an ops tool without the key,
        whose entries the sealer names).
        """
        self.url = url
        self._audit_key = audit_chain.row_key(secret_key) if secret_key else None
        self.engine: AsyncEngine = create_async_engine(
            async_url(url),
            pool_size=pool_size,
            max_overflow=pool_size if max_overflow is None else max_overflow,
            pool_pre_ping=False,  # replaced by _ping_if_stale: a ping only after an idle spell
            pool_recycle=1800,
        )
        # When the driver path last met a dead connection (SQLAlchemy invalidates the pool on
        # its own path's disconnects; this path's is told here): older pooled ones get pinged.
        self._broken_at = float("-inf")
        pool = self.engine.sync_engine.pool
        event.listen(pool, "checkin", _mark_idle)
        event.listen(pool, "checkout", self._ping_if_stale)

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction: commit on success, roll back on error; driver errors translated."""
        try:
            async with self.engine.begin() as conn:
                conn.info[AUDIT_KEY] = self._audit_key
                yield conn
        except IntegrityError as exc:
            raise Conflict(_constraint_message(exc)) from exc
        except DBAPIError as exc:
            if is_unavailable(exc):
                raise Unavailable("the database is not reachable; retry shortly") from exc
            raise
        except UNAVAILABLE as exc:
            raise Unavailable("the database is not reachable; retry shortly") from exc

    @contextlib.asynccontextmanager
    async def driver(self) -> AsyncIterator[DriverConnection]:
        """A transaction straight on the driver, for the hot paths (db/driver.py says why).

        The same pool, the same commit-or-roll-back and the same translated errors as begin().
        """
        try:
            async with self.engine.connect() as conn:
                raw = (await conn.get_raw_connection()).driver_connection
                assert raw is not None  # a checked-out connection always has its driver's
                try:
                    async with raw.transaction():
                        yield DriverConnection(raw, {AUDIT_KEY: self._audit_key})
                except UNAVAILABLE:
                    # SQLAlchemy never saw this connection fail: drop it from the pool here,
                    # and have the others pooled before now pinged before their next use.
                    self._broken_at = time.monotonic()
                    await conn.invalidate()
                    raise
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise Conflict(_constraint_message_of(exc.constraint_name or "")) from exc
        except DBAPIError as exc:  # from the pool's checkout (connect, ping)
            if is_unavailable(exc):
                raise Unavailable("the database is not reachable; retry shortly") from exc
            raise
        except UNAVAILABLE as exc:
            raise Unavailable("the database is not reachable; retry shortly") from exc

    def _ping_if_stale(self, dbapi_conn: Any, record: Any, _proxy: Any) -> None:  # noqa: ANN401
        """After a Postgres restart, a stale pooled connection is replaced before use.

        Pinged: one idle for PING_IDLE_SECONDS, or pooled before the driver path last met a
        dead one. Runs inside SQLAlchemy's greenlet (the adapted connection's ping awaits). A
        fresh connection (no mark) needs no ping. DisconnectionError makes the pool retry
        with a new connection.
        """
        since = record.info.get(_IDLE_SINCE)
        if since is None:
            return
        if time.monotonic() - since < PING_IDLE_SECONDS and since > self._broken_at:
            return
        try:
            dbapi_conn.ping()
        except Exception as exc:
            raise DisconnectionError("stale pooled connection") from exc

    async def dispose(self) -> None:
        await self.engine.dispose()


def _mark_idle(_dbapi_conn: Any, record: Any) -> None:  # noqa: ANN401  (SQLAlchemy's hook)
    record.info[_IDLE_SINCE] = time.monotonic()


def _constraint_message(exc: IntegrityError) -> str:
    return _constraint_message_of(
        getattr(getattr(exc.orig, "__cause__", None), "constraint_name", None) or ""
    )


def _constraint_message_of(name: str) -> str:
    if "tokens_one_live_name" in name:
        return "a live token with that name exists"
    if "leases_one_live_per_job" in name:
        return "the job already has a live lease"
    return "the change conflicts with existing data"
