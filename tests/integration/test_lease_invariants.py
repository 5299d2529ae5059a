"""The lease invariants, enforced by Postgres and tested under concurrency on a real database."""

import asyncio
import uuid

import pytest
from sqlalchemy import text

from service.core.errors import Conflict
from service.core.placement import PoolSpec
from service.db.engine import Database
from service.domain import dispatch

POOLS = {"gpu": PoolSpec(name="gpu", slots={"default": 4})}


async def add_worker(db: Database, name: str) -> str:
    worker_id = str(uuid.uuid4())
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO workers (id, name, pool, instance, server_id, host) "
                "VALUES (:id, :n, 'gpu', 'i', 's', '{}')"
            ),
            {"id": worker_id, "n": name},
        )
    return worker_id


async def add_jobs(db: Database, n: int) -> list[int]:
    async with db.begin() as conn:
        rows = await conn.execute(
            text(
                "INSERT INTO jobs (tenant, pool, command, created_by) "
                "SELECT 'default', 'gpu', ARRAY['true'], 'test' FROM generate_series(1, :n) "
                "RETURNING id"
            ),
            {"n": n},
        )
        return [r[0] for r in rows]


async def until_another_waits_for_a_lock(db: Database, timeout: float = 10.0) -> None:
    """Return once another session of this database is blocked on a lock (the racing insert)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with db.engine.connect() as probe:
        while asyncio.get_running_loop().time() < deadline:
            waiting = (
                await probe.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    )
                )
            ).scalar_one()
            await probe.rollback()  # a fresh snapshot of pg_stat_activity each time
            if waiting:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the racing transaction never waited for the lock")


class TestOneLiveLease:
    async def test_second_live_lease_is_refused_by_the_database(self, db):
        """Two transactions racing to make a live lease for one job: exactly one commits."""
        w1, w2 = await add_worker(db, "w1"), await add_worker(db, "w2")
        (job,) = await add_jobs(db, 1)

        async def lease(worker_id: str, epoch: int) -> bool:
            try:
                async with db.begin() as conn:
                    await conn.execute(
                        text(
                            "INSERT INTO leases (job_id, epoch, worker_id, kind) "
                            "VALUES (:j, :e, :w, 'default')"
                        ),
                        {"j": job, "e": epoch, "w": worker_id},
                    )
                    await until_another_waits_for_a_lock(db)  # hold the row until it tries
            except Conflict:
                return False
            return True

        results = await asyncio.gather(lease(w1, 1), lease(w2, 2))
        assert sorted(results) == [False, True]

    async def test_concurrent_dispatch_passes_lease_each_job_once(self, db):
        """Ten servers' passes at once over 30 jobs (40 slots): every job leased exactly once."""
        # One pass per worker, as on ten servers: they compete for the same queued jobs.
        workers = [await add_worker(db, f"w{i}") for i in range(10)]
        jobs = await add_jobs(db, 30)
        grants = await asyncio.gather(*(dispatch.run_pass(db, [w], POOLS) for w in workers))
        leased = [job.id for done in grants for _, job in done.grants]
        assert sorted(leased) == sorted(set(leased))  # nothing leased twice
        async with db.begin() as conn:
            live = (
                await conn.execute(
                    text("SELECT job_id, count(*) FROM leases WHERE state = 'live' GROUP BY job_id")
                )
            ).all()
            per_worker = (
                await conn.execute(
                    text(
                        "SELECT worker_id, count(*) FROM leases WHERE state = 'live' GROUP BY worker_id"
                    )
                )
            ).all()
        assert all(n == 1 for _, n in live)
        assert {j for j, _ in live} == set(leased) <= set(jobs)
        # Skipped locks leave some jobs for the next pass; a second round takes the rest.
        more = await asyncio.gather(*(dispatch.run_pass(db, [w], POOLS) for w in workers))
        leased += [job.id for done in more for _, job in done.grants]
        assert sorted(leased) == sorted(jobs)
        assert all(n <= 4 for _, n in per_worker)  # never over a worker's slots

    @pytest.mark.parametrize("epoch", [1, 2])
    async def test_epochs_are_unique_per_job(self, db, epoch):
        """A job's epoch names one lease only, live or not."""
        w = await add_worker(db, "w")
        (job,) = await add_jobs(db, 1)
        insert = text(
            "INSERT INTO leases (job_id, epoch, worker_id, kind, state) "
            "VALUES (:j, :e, :w, 'default', 'expired')"
        )
        async with db.begin() as conn:
            await conn.execute(insert, {"j": job, "e": epoch, "w": w})
        with pytest.raises(Conflict):
            async with db.begin() as conn:
                await conn.execute(insert, {"j": job, "e": epoch, "w": w})
