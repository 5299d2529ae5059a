"""Chaos: hundreds of jobs, three workers, two servers, random kill -9 of workers and servers.

Bounded to about a minute of chaos in CI; BERTH_CHAOS_SECONDS makes it longer. At the end every
job is terminal, none was lost, no two copies of a job ran at once (from the jobs' own records),
and no result came from a stale lease (the one accepted result is the last epoch's).
"""

import asyncio
import os
import random
import signal
import time

import asyncpg

from service.db.engine import plain_url
from tests import marks
from tests.e2e.test_faults import attached
from tests.procs import wait_for

CHAOS_SECONDS = float(os.environ.get("BERTH_CHAOS_SECONDS", "40"))
JOBS = 300


async def lease_facts(url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        return await conn.fetch(
            """
            SELECT j.id, j.state, j.attempt,
                   count(*) FILTER (WHERE l.state = 'done') AS done,
                   max(l.epoch) FILTER (WHERE l.state = 'done') AS done_epoch,
                   count(*) FILTER (WHERE l.state = 'live') AS live
            FROM jobs j LEFT JOIN leases l ON l.job_id = j.id
            GROUP BY j.id
            """
        )
    finally:
        await conn.close()


class TestChaos:
    def test_random_kill9_of_workers_and_servers(
        self, server_factory, worker_factory, shared_dir, sync_db_url
    ):
        """Under random kill -9, every job finishes once, with no overlap and no stale result."""
        rng = random.Random(int(os.environ.get("BERTH_CHAOS_SEED", "7")))
        pools = {"pools": {"gpu": {"slots": {"default": 2}}}}
        servers = [server_factory(pools, builtin_worker=False, name=n) for n in ("a", "b")]
        urls = ",".join(s.url for s in servers)
        tokens = {f"w{i}": servers[0].worker_token(f"w{i}") for i in range(3)}
        workers = {
            name: worker_factory(servers[0], t, "gpu", "--server", urls, name=name)
            for name, t in tokens.items()
        }
        wait_for(lambda: all(attached(servers[0], n) for n in tokens), 30, "workers attached")
        m = shared_dir
        ids: list[int] = []
        for i in range(0, JOBS, 100):
            batch = [
                {
                    "command": marks.script(m, rng.choice((0.1, 0.3, 0.6))),
                    "pool": "gpu",
                    "max_attempts": 50,
                }
                for _ in range(100)
            ]
            ids += servers[i // 100 % 2].api("POST", "/api/v1/jobs", json=batch).json()["ids"]
        kills = {"worker": 0, "server": 0}
        restarts = 0
        deadline = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 3.0))
            if rng.random() < 0.6:
                name = rng.choice(sorted(workers))
                workers[name].kill(signal.SIGKILL)
                kills["worker"] += 1
                time.sleep(rng.uniform(0.0, 1.0))
                restarts += 1
                workers[name] = worker_factory(
                    servers[0], tokens[name], "gpu", "--server", urls, name=f"{name}-{restarts}"
                )
            else:
                victim = rng.choice(servers)
                victim.kill(signal.SIGKILL)
                kills["server"] += 1
                time.sleep(rng.uniform(0.5, 1.5))
                victim.start()
        live = next(s for s in servers if s.proc and s.proc.poll() is None)

        def settled() -> bool:
            states = [
                j["state"] for j in live.api("GET", "/api/v1/jobs", params={"limit": 1000}).json()
            ]
            return len(states) == JOBS and all(
                s in ("succeeded", "failed", "cancelled", "timed_out") for s in states
            )

        wait_for(settled, 120, "every job to reach a terminal state", every=1.0)
        facts = asyncio.run(lease_facts(sync_db_url))
        runs = marks.copies(m)
        reruns = sum(len(c) - 1 for c in runs.values())
        print(
            f"\nchaos: {JOBS} jobs, {CHAOS_SECONDS:.0f}s, kills={kills}, copies re-run={reruns}, "
            f"max attempt={max(f['attempt'] for f in facts)}"
        )
        assert len(facts) == JOBS and sorted(f["id"] for f in facts) == sorted(ids)
        assert all(f["state"] == "succeeded" for f in facts), [
            dict(f) for f in facts if f["state"] != "succeeded"
        ]
        assert all(f["live"] == 0 for f in facts)
        # One accepted result per job, and it is the last epoch's: nothing from a stale lease.
        assert all(f["done"] == 1 and f["done_epoch"] == f["attempt"] for f in facts)
        assert marks.overlaps(m) == [], "two copies of a job ran at once"
        for f in facts:
            ended = [c for c in runs[f["id"]] if c.ended]
            assert ended, f"job {f['id']} never completed a copy"
            assert f["attempt"] in {c.epoch for c in ended}
