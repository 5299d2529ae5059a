"""The error policy in process (docs/architecture.md, Errors): expected failures are retried with
a warning; a bug is logged with its traceback and, in a leader loop, ends the loop and the
supervisor after `max_failures` passes in a row; spawned tasks log what they die of."""

import asyncio

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from service.background.loop import Loop, LoopFailed
from service.background.supervisor import run_when_leader
from service.core.errors import ProviderError
from service.db.engine import Database
from service.db.leader import Leader
from service.domain import limits
from service.tasks import spawn
from tests.integration.conftest import config, rebuilt

# Nothing listens on port 1 of loopback: connecting is refused, as while Postgres restarts.
REFUSING = "postgresql://root@127.0.0.1:1/berth"


class Scripted(Loop):
    """A loop whose passes do what a test says: `ok`, `bug`, `provider`, or a real query."""

    name = "scripted"

    def __init__(self, db: Database | None, script: list[str]) -> None:
        super().__init__(interval=0.0)
        self.db, self.script, self.passes = db, script, 0

    async def run_once(self) -> None:
        step = self.script[min(self.passes, len(self.script) - 1)]
        self.passes += 1
        if step == "bug":
            raise KeyError("a bug in run_once")
        if step == "provider":
            raise ProviderError("the provider refuses: quota")
        if step == "query":
            assert self.db is not None
            await limits.effective_config(self.db, config())


def events(logs: list[dict], name: str) -> list[dict]:
    return [e for e in logs if e["event"] == name]


class TestLoop:
    async def test_the_database_refusing_connections_is_retried_with_a_warning(self):
        """Every pass meets a database that refuses connections (Unavailable): each is a warning,
        never counted as a bug, however many in a row."""
        db = Database(REFUSING, pool_size=1)
        loop = Scripted(db, ["query"])
        try:
            with capture_logs() as logs:
                await loop.run(asyncio.Event(), passes=4, max_failures=1)
        finally:
            await db.dispose()
        warned = events(logs, "loop_pass_failed")
        assert len(warned) == 4 and all(w["log_level"] == "warning" for w in warned)
        assert "not reachable" in warned[0]["error"]
        assert not events(logs, "loop_pass_crashed")

    async def test_a_provider_error_is_expected_too(self):
        with capture_logs() as logs:
            await Scripted(None, ["provider"]).run(asyncio.Event(), passes=3, max_failures=1)
        assert len(events(logs, "loop_pass_failed")) == 3

    async def test_a_bug_is_logged_with_its_traceback_and_ends_the_loop_after_max_failures(self):
        """Each failed pass is an error event carrying the exception (rendered as a traceback);
        the third in a row raises LoopFailed, chained to the bug."""
        loop = Scripted(None, ["bug"])
        with capture_logs() as logs, pytest.raises(LoopFailed) as failed:
            await loop.run(asyncio.Event(), max_failures=3)
        crashed = events(logs, "loop_pass_crashed")
        assert [c["failures"] for c in crashed] == [1, 2, 3]
        assert all(c["log_level"] == "error" and c["exc_info"] is True for c in crashed)
        assert loop.passes == 3
        assert isinstance(failed.value.__cause__, KeyError)
        assert "scripted loop failed 3 passes in a row: KeyError" in str(failed.value)

    async def test_a_pass_that_succeeds_resets_the_count(self):
        """bug, ok, bug, ok, ...: never two in a row, so the loop runs all its passes."""
        loop = Scripted(None, ["bug", "ok"] * 5)
        await loop.run(asyncio.Event(), passes=10, max_failures=2)
        assert loop.passes == 10


class TestSupervisor:
    async def test_a_loop_with_a_bug_ends_the_supervisor_instead_of_stepping_down(self, db_url):
        """Under a real advisory lock: the failing loop's LoopFailed leaves run_when_leader (which
        used to step down and take the lock again, forever), and the lock is released."""
        stop = asyncio.Event()
        loop = Scripted(None, ["bug"])
        with pytest.raises(ExceptionGroup) as ended:
            await asyncio.wait_for(
                run_when_leader(Leader(db_url), [loop], stop, max_failures=2), timeout=30
            )
        assert ended.group_contains(LoopFailed)
        assert loop.passes == 2
        other = Leader(db_url)
        async with other.held(stop):  # the lock is free again: taken at once
            pass

    async def test_a_database_that_refuses_is_waited_out(self):
        """No database to take the lock on: warnings, no exception, and it returns on stop."""
        stop = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(run_when_leader(Leader(REFUSING), [], stop))
            while len(events(logs, "leader_db_unavailable")) < 2:
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(task, timeout=30)
        assert all(e["log_level"] == "warning" for e in events(logs, "leader_db_unavailable"))


class TestSpawn:
    async def test_a_spawned_tasks_exception_is_logged_with_its_traceback(self):
        async def broken() -> None:
            raise ValueError("lost in a task nobody awaits")

        with capture_logs() as logs:
            task = spawn(broken(), name="broken-task")
            await asyncio.wait([task])
            await asyncio.sleep(0)  # done callbacks run on the next turn
        [failed] = events(logs, "task_failed")
        assert failed["task"] == "broken-task" and failed["log_level"] == "error"
        assert isinstance(failed["exc_info"], ValueError)

    async def test_a_cancelled_task_is_not_a_failure(self):
        with capture_logs() as logs:
            task = spawn(asyncio.sleep(60), name="cancelled")
            task.cancel()
            await asyncio.wait([task])
            await asyncio.sleep(0)
        assert not events(logs, "task_failed")


class TestReady:
    async def test_an_unmigrated_database_is_not_ready(self, api):
        """No alembic_version table: 503 naming it (the one failure that means "not migrated")."""
        async with api.rt.db.begin() as conn:
            await conn.execute(text("ALTER TABLE alembic_version RENAME TO alembic_version_away"))
        try:
            r = await api.client.get("/readyz")
            assert r.status_code == 503 and r.json()["error"] == "the database is not migrated"
        finally:
            async with api.rt.db.begin() as conn:
                await conn.execute(
                    text("ALTER TABLE alembic_version_away RENAME TO alembic_version")
                )

    async def test_a_database_that_refuses_is_not_ready_either(self, api):
        rt = rebuilt(api, db=Database(REFUSING, pool_size=1))
        r = await rt.client.get("/readyz")
        assert r.status_code == 503 and "not reachable" in r.json()["error"]
        await rt.rt.db.dispose()
