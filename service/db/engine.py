"""The Database: one async engine, one way to open a transaction, driver errors translated once.

`begin()` is the only way domain code writes: a transaction that commits on success and rolls
back on any exception. Driver errors become berth's own (Conflict, Unavailable) here, so the
API maps them to 4xx/503 in one place and never leaks a 500.
"""

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from sqlalchemy import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.core import audit_chain
from service.core.errors import Conflict, Unavailable

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

    def __init__(self, url: str, *, pool_size: int = 10, secret_key: bytes | None = None) -> None:
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
            max_overflow=pool_size,
            pool_pre_ping=True,  # after a Postgres restart, stale pooled connections are replaced
            pool_recycle=1800,
        )

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

    async def dispose(self) -> None:
        await self.engine.dispose()


def _constraint_message(exc: IntegrityError) -> str:
    name = getattr(getattr(exc.orig, "__cause__", None), "constraint_name", None) or ""
    if "tokens_one_live_name" in name:
        return "a live token with that name exists"
    if "leases_one_live_per_job" in name:
        return "the job already has a live lease"
    return "the change conflicts with existing data"
