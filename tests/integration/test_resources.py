"""Per-job resources and tenant quotas in the claim, on a real database (SPEC section 4).

Dispatch passes run as servers run them (domain/dispatch.run_pass); two `Database`s on one
database stand for two servers sharing it.
"""

import asyncio
import json
import uuid

from sqlalchemy import text

from service.core.placement import PoolSpec, Quota, Quotas
from service.db.engine import Database
from service.db.queries import leases as leases_q
from service.domain import dispatch
from tests.integration.conftest import Api
from tests.integration.test_lease_invariants import until_another_waits_for_a_lock

POOLS = {"gpu": PoolSpec(name="gpu", slots={"default": 8})}


async def add_worker(db: Database, name: str, **capacity: float) -> str:
    worker_id = str(uuid.uuid4())
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO workers (id, name, pool, instance, server_id, host, capacity) "
                "VALUES (:id, :n, 'gpu', 'i', 's', '{}', CAST(:c AS jsonb))"
            ),
            {"id": worker_id, "n": name, "c": json.dumps(capacity)},
        )
    return worker_id


async def add_jobs(
    db: Database, n: int, *, tenant: str = "default", cpus: float = 0, gpus: int = 0
) -> list[int]:
    async with db.begin() as conn:
        await conn.execute(
            text("INSERT INTO tenants (name) VALUES (:t) ON CONFLICT DO NOTHING"), {"t": tenant}
        )
        rows = await conn.execute(
            text(
                "INSERT INTO jobs (tenant, pool, command, created_by, cpus, gpus) "
                "SELECT :t, 'gpu', ARRAY['true'], 'test', :c, :g FROM generate_series(1, :n) "
                "RETURNING id"
            ),
            {"n": n, "t": tenant, "c": cpus, "g": gpus},
        )
        return [r[0] for r in rows]


async def leased(db: Database, tenant: str) -> int:
    async with db.begin() as conn:
        return int(
            (
                await conn.execute(
                    text("SELECT count(*) FROM jobs WHERE tenant = :t AND state = 'leased'"),
                    {"t": tenant},
                )
            ).scalar_one()
        )


async def finish(db: Database, job_ids: list[int]) -> None:
    async with db.begin() as conn:
        await conn.execute(
            text("UPDATE leases SET state = 'ended' WHERE job_id = ANY(:j) AND state = 'live'"),
            {"j": job_ids},
        )
        await conn.execute(
            text("UPDATE jobs SET state = 'succeeded' WHERE id = ANY(:j)"), {"j": job_ids}
        )


class TestCapacity:
    async def test_two_jobs_of_two_cpus_on_a_worker_of_three(self, db):
        """Slots are free for both, but 2 + 2 > 3: one runs, the other once it ended."""
        w = await add_worker(db, "w", cpus=3.0, memory_mb=4096, gpus=0)
        first, second = await add_jobs(db, 2, cpus=2)
        done = await dispatch.run_pass(db, [w], POOLS)
        assert [j.id for _, j in done.grants] == [first]
        assert (await dispatch.run_pass(db, [w], POOLS)).grants == []
        async with db.begin() as conn:  # the lease carries the request: the worker's reserve
            assert (await leases_q.reserved(conn, [w]))[w].cpus == 2.0
        await finish(db, [first])
        assert [j.id for _, j in (await dispatch.run_pass(db, [w], POOLS)).grants] == [second]

    async def test_gpus_go_one_each_and_the_third_waits(self, db):
        w = await add_worker(db, "w", cpus=8.0, memory_mb=4096, gpus=2)
        await add_jobs(db, 3, gpus=1)
        done = await dispatch.run_pass(db, [w], POOLS)
        assert len(done.grants) == 2
        assert [(j.gpus, j.cpus) for _, j in done.grants] == [(1, 0.0), (1, 0.0)]

    async def test_a_worker_of_an_older_berth_offers_nothing(self, db):
        """capacity {} (no hello field): jobs asking nothing run there; those asking wait."""
        w = await add_worker(db, "old")
        asks = await add_jobs(db, 1, cpus=1)
        plain = await add_jobs(db, 2)
        done = await dispatch.run_pass(db, [w], POOLS)
        assert sorted(j.id for _, j in done.grants) == plain
        assert asks[0] not in {j.id for _, j in done.grants}


class TestQuotaInTheClaim:
    async def test_two_servers_never_pass_max_running(self, db_url):
        """Server 1 holds tenant a's quota lock with 2 grants uncommitted; server 2's pass,
        which counted 0 running for a when it chose, waits for the lock, counts again, grants a
        nothing more and b's jobs still flow."""
        one, two = Database(db_url), Database(db_url)
        try:
            w1 = await add_worker(one, "w1", cpus=8.0, memory_mb=4096, gpus=0)
            w2 = await add_worker(one, "w2", cpus=8.0, memory_mb=4096, gpus=0)
            a_jobs = await add_jobs(one, 6, tenant="a")
            await add_jobs(one, 3, tenant="b")
            quotas = Quotas(tenants={"a": Quota(max_running=2, running_key="x")})

            async def server_one() -> None:
                async with one.begin() as conn:
                    assert await leases_q.hold_quotas(conn, ["a"]) == {"a": (0, 0)}
                    # Its last two: server 2 picks a's first two, which nobody holds.
                    locked = await leases_q.lock_queued(conn, a_jobs[-2:], want=2)
                    await leases_q.grant(conn, [(j, w1, "w1") for j in sorted(locked)])
                    await until_another_waits_for_a_lock(one)  # server 2 is at the lock
                    # committing now: server 2 must count these two

            second = asyncio.create_task(dispatch.run_pass(two, [w2], POOLS, quotas))
            await server_one()
            done = await second
            assert await leased(one, "a") == 2
            assert {j.tenant for _, j in done.grants} == {"b"}
            assert await leased(one, "b") == 3
            # and later passes keep a at its quota while it runs 2
            assert (await dispatch.run_pass(two, [w2], POOLS, quotas)).grants == []
            await finish(one, a_jobs[-1:])
            again = await dispatch.run_pass(two, [w2], POOLS, quotas)
            assert [j.tenant for _, j in again.grants] == ["a"]
        finally:
            await one.dispose()
            await two.dispose()

    async def test_max_gpus(self, db):
        w = await add_worker(db, "w", cpus=8.0, memory_mb=4096, gpus=4)
        await add_jobs(db, 3, tenant="a", gpus=1)
        await add_jobs(db, 1, tenant="b", gpus=2)
        quotas = Quotas(default=Quota(max_gpus=2, gpus_key="tenants.default.max_gpus"))
        done = await dispatch.run_pass(db, [w], POOLS, quotas)
        held = {}
        for _, j in done.grants:
            held[j.tenant] = held.get(j.tenant, 0) + j.gpus
        assert held == {"a": 2, "b": 2}


GPU = {"pools": {"gpu": {"slots": {"default": 4}, "default_cpus": 0.5, "default_memory": "1G"}}}


class TestApi:
    async def test_submit_takes_resources_and_pool_defaults(self, api_with):
        api: Api = await api_with(GPU)
        r = await api.call(
            "POST",
            "/api/v1/jobs",
            json={"command": ["true"], "pool": "gpu", "cpus": 2.5, "gpus": 1},
        )
        assert r.status_code == 201, r.text
        job = r.json()
        assert (job["cpus"], job["memory_mb"], job["gpus"]) == (2.5, 1024, 1)
        r = await api.call("POST", "/api/v1/jobs", json={"command": ["true"], "memory_mb": 64})
        assert (r.json()["cpus"], r.json()["memory_mb"], r.json()["gpus"]) == (0, 64, 0)

    async def test_bad_requests_are_4xx_naming_the_field(self, api_with):
        api: Api = await api_with(GPU)
        for body, field in (
            ({"cpus": -1}, "cpus"),
            ({"gpus": 1.5}, "gpus"),
            ({"memory_mb": "2G"}, "memory_mb"),
            ({"cpus": "nan"}, "cpus"),
        ):
            r = await api.call("POST", "/api/v1/jobs", json={"command": ["true"], **body})
            assert r.status_code == 400, r.text
            assert field in r.json()["error"]

    async def test_a_quota_set_by_limits_is_in_force_and_said(self, api_with, db_url):
        """`limits set tenants.a.max_running=1` (no longer refused) makes the claim skip a,
        and `job show` says why a's next job waits."""
        api: Api = await api_with(GPU)
        r = await api.call(
            "PUT",
            "/api/v1/limits/tenants.a.max_running",
            json={"value": 1, "reason": "one at a time"},
        )
        assert r.status_code == 200, r.text
        assert api.rt.quotas.of("a").max_running == 1
        w = await add_worker(api.rt.db, "w", cpus=8.0, memory_mb=8192, gpus=0)
        ids = [
            (
                await api.call("POST", "/api/v1/jobs", json={"command": ["true"], "tenant": "a"})
            ).json()["id"]
            for _ in range(2)
        ]
        done = await dispatch.run_pass(api.rt.db, [w], api.rt.pools, api.rt.quotas)
        assert [j.id for _, j in done.grants] == ids[:1]
        shown = (await api.call("GET", f"/api/v1/jobs/{ids[1]}")).json()
        assert shown["waiting_for"] == "tenant a runs 1 jobs, its quota tenants.a.max_running = 1"
        [row] = (await api.call("GET", "/api/v1/workers")).json()
        assert row["no_lease"] == "quota"
        assert row["capacity"] == {"cpus": 8.0, "memory_mb": 8192, "gpus": 0}
