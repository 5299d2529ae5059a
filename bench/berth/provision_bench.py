"""How long the provisioning loop takes to decide one pass: 100,000 queued jobs over 50 pools.

A pass's decision is one picture of every provisioned pool (a few aggregate queries: queued
jobs by pool, kind, labels and policy; free slots of attached workers; provisioned workers;
start backoff) and a pure plan per pool. This times exactly that, `provisioning.picture` plus
`plan` for every pool, on a real, migrated Postgres, with no provider calls (those are the
provider's latency, not berth's).

    python bench/berth/provision_bench.py [--jobs 100000] [--pools 50] [--runs 20]

Prints one JSON object: the median and max of the runs in milliseconds, and the sizes.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH_DIR.parent))

from sqlalchemy import text  # noqa: E402

from service.config import Config, load  # noqa: E402
from service.core import provisioning as plans  # noqa: E402
from service.db import migrate  # noqa: E402
from service.db.engine import Database  # noqa: E402
from service.domain import provisioning  # noqa: E402
from tests import pg  # noqa: E402


def config(pools: int) -> Config:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["BERTH_CONFIG_JSON"] = json.dumps(
        {
            "pools": {
                f"p{i}": {
                    "slots": {"default": 2, "eval": 1},
                    "provisioner": {"max": 10, "labels": ["cuda"] if i % 2 else []},
                }
                for i in range(pools)
            }
        }
    )
    return load(Path("/nonexistent/berth.toml"), environ=env)


async def fill(db: Database, jobs: int, pools: int) -> None:
    async with db.begin() as conn:
        await conn.execute(text("INSERT INTO tenants (name) VALUES ('t1'), ('t2'), ('t3')"))
        await conn.execute(
            text(
                """
                INSERT INTO jobs (tenant, pool, kind, labels, device_policy, command, created_by)
                SELECT 't' || (1 + g % 3), 'p' || (g % :pools),
                       CASE WHEN g % 5 = 0 THEN 'eval' ELSE 'default' END,
                       CASE WHEN g % 7 = 0 THEN ARRAY['cuda'] ELSE ARRAY[]::text[] END,
                       CASE WHEN g % 11 = 0 THEN 'prefer' ELSE 'require' END,
                       ARRAY['true'], 'bench'
                FROM generate_series(1, :n) AS g
                """
            ),
            {"n": jobs, "pools": pools},
        )
        # Each pool already runs a few provisioned workers, some attached with leases.
        await conn.execute(
            text(
                """
                INSERT INTO provisioned (name, pool, provider, state)
                SELECT 'p' || p || '-w' || w, 'p' || p, 'process',
                       CASE WHEN w < 2 THEN 'running' ELSE 'starting' END
                FROM generate_series(0, :pools - 1) AS p, generate_series(0, 2) AS w
                """
            ),
            {"pools": pools},
        )
        await conn.execute(
            text(
                """
                INSERT INTO workers (id, name, pool, instance, server_id, host)
                SELECT gen_random_uuid(), name, pool, 'i', 's', '{}'
                FROM provisioned WHERE state = 'running'
                """
            )
        )
        await conn.execute(text("ANALYZE"))


async def measure(url: str, jobs: int, pools: int, runs: int) -> dict[str, object]:
    cfg = config(pools)
    db = Database(url)
    try:
        await fill(db, jobs, pools)
        times = []
        for _ in range(runs + 1):  # the first warms the pool and the plan cache
            started = time.perf_counter()
            picture = await provisioning.picture(db, cfg)
            decided = {name: plans.plan(p) for name, p in picture.pools.items()}
            times.append((time.perf_counter() - started) * 1000)
        starts = sum(p.start for p in decided.values())
    finally:
        await db.dispose()
    measured = times[1:]
    return {
        "scenario": "provision-decide",
        "jobs": jobs,
        "pools": pools,
        "runs": runs,
        "median_ms": round(statistics.median(measured), 2),
        "max_ms": round(max(measured), 2),
        "target_ms": 100,
        "starts_decided": starts,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--pools", type=int, default=50)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    with pg.server() as admin, pg.scratch(admin, "bench_provision") as url:
        migrate.upgrade(url)
        result = asyncio.run(measure(url, args.jobs, args.pools, args.runs))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
