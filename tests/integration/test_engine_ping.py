"""The pool pings a connection only after an idle spell, and replaces one that died meanwhile."""

from sqlalchemy import text

from service.core.errors import Unavailable
from service.db import engine
from service.db.engine import Database


async def _backend_pid(db: Database) -> int:
    async with db.begin() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _terminate(db_url: str, pid: int) -> None:
    other = Database(db_url, pool_size=1)
    try:
        async with other.begin() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    finally:
        await other.dispose()


async def test_an_idle_connection_that_died_is_replaced_before_use(db_url, monkeypatch):
    monkeypatch.setattr(engine, "PING_IDLE_SECONDS", 0.0)  # every pooled connection is "idle"
    db = Database(db_url, pool_size=1)
    try:
        pid = await _backend_pid(db)
        await _terminate(db_url, pid)
        # Pinged at checkout, found dead, replaced: the transaction itself never sees it.
        assert await _backend_pid(db) != pid
    finally:
        await db.dispose()


async def test_a_busy_connection_is_not_pinged_and_a_death_costs_one_transaction(
    db_url, monkeypatch
):
    monkeypatch.setattr(engine, "PING_IDLE_SECONDS", 3600.0)  # never idle long enough
    db = Database(db_url, pool_size=1)
    try:
        pid = await _backend_pid(db)
        await _terminate(db_url, pid)
        # No ping: the first transaction meets the dead connection, as a retryable 503 ...
        try:
            await _backend_pid(db)
        except Unavailable:
            pass
        else:
            raise AssertionError("a dead connection was used without error: it was pinged")
        # ... and the pool, invalidated by that disconnect, connects afresh for the next.
        assert await _backend_pid(db) != pid
    finally:
        await db.dispose()
