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


async def _driver_pid(db: Database) -> int:
    async with db.driver() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def test_on_the_driver_path_a_restart_costs_one_transaction_not_one_per_connection(
    db_url, monkeypatch
):
    """The hot paths' transactions (db.driver()) meet dead connections as begin()'s do: the
    first fails as a retryable 503, and the others pooled before it are pinged and replaced
    instead of each failing a transaction of its own."""
    monkeypatch.setattr(engine, "PING_IDLE_SECONDS", 3600.0)
    db = Database(db_url, pool_size=3, max_overflow=0)
    try:
        # Three pooled connections, all alive and recently used.
        async with db.driver() as a, db.driver() as b, db.driver() as c:
            pids = {
                int((await x.execute(text("SELECT pg_backend_pid()"))).scalar_one())
                for x in (a, b, c)
            }
        assert len(pids) == 3
        for pid in pids:
            await _terminate(db_url, pid)
        failed = 0
        seen = []
        for _ in range(4):
            try:
                seen.append(await _driver_pid(db))
            except Unavailable:
                failed += 1
        assert failed == 1, failed
        assert len(seen) == 3 and not set(seen) & pids
        # begin() shares the pool and finds it fresh too.
        assert await _backend_pid(db) not in pids
    finally:
        await db.dispose()


async def test_the_driver_path_translates_a_broken_constraint_and_rolls_back(db_url):
    """A unique violation on the driver path is a Conflict (409), and nothing of the
    transaction stays."""
    from service.core.errors import Conflict

    db = Database(db_url, pool_size=1)
    try:
        async with db.driver() as conn:
            await conn.execute(text("CREATE TEMP TABLE IF NOT EXISTS t_ping (k int UNIQUE)"))
        try:
            async with db.driver() as conn:
                await conn.execute(text("CREATE TEMP TABLE IF NOT EXISTS t_ping2 (k int)"))
                await conn.execute(text("INSERT INTO t_ping VALUES (1), (1)"))
        except Conflict:
            pass
        else:
            raise AssertionError("a unique violation passed")
        async with db.driver() as conn:
            gone = (
                await conn.execute(text("SELECT to_regclass('pg_temp.t_ping2') IS NULL"))
            ).scalar_one()
        assert gone is True
    finally:
        await db.dispose()
