"""Ceiling: the fastest a Postgres ``FOR UPDATE SKIP LOCKED`` queue can go on this machine.

Runs inside ``bench/.venvs/ceilings`` (raw asyncpg, no framework). A dedicated database
``bench_ceiling`` is recreated per run with one ``jobs`` table holding ``--jobs`` queued rows and a
partial index on the queued ones, as a real queue would have. ``--connections`` concurrent loops
then each repeat, until nothing is left:

* ``two-step`` (default, what a real worker must do because the job body runs in between): one
  statement claims up to ``--batch`` rows (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP
  LOCKED LIMIT n) RETURNING id``), a second marks exactly those rows done;
* ``one-step``: a single statement claims and completes ``--batch`` rows (the absolute ceiling).

Every statement is its own autocommit transaction. Reports jobs/s from the first claim to the last
completion, and verifies that every row ended ``done`` exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import benchlib

DATABASE = "bench_ceiling"

SCHEMA = """
CREATE TABLE jobs (
    id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}',
    worker int,
    claimed_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX jobs_queued ON jobs (id) WHERE state = 'queued';
"""

CLAIM = """
UPDATE jobs SET state = 'running', worker = $2, claimed_at = now()
WHERE id IN (
    SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id
"""

COMPLETE = """
UPDATE jobs SET state = 'done', finished_at = now() WHERE id = ANY($1::bigint[]) AND worker = $2
"""

CLAIM_AND_COMPLETE = """
UPDATE jobs SET state = 'done', worker = $2, claimed_at = now(), finished_at = now()
WHERE id IN (
    SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id
"""


async def loop(dsn: str, worker: int, batch: int, mode: str) -> int:
    conn = await asyncpg.connect(dsn)
    done = 0
    try:
        claim = await conn.prepare(CLAIM if mode == "two-step" else CLAIM_AND_COMPLETE)
        complete = await conn.prepare(COMPLETE)
        while True:
            rows = await claim.fetch(batch, worker)
            if not rows:
                # SKIP LOCKED can return nothing while other loops still hold rows; an empty
                # result means nothing is *queued* any more, which is the end of the drain.
                return done
            if mode == "two-step":
                await complete.fetch([r["id"] for r in rows], worker)
            done += len(rows)
    finally:
        await conn.close()


async def run(args: argparse.Namespace) -> dict[str, object]:
    dsn = benchlib.recreate_database(DATABASE)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
        await conn.execute(
            "INSERT INTO jobs (payload) SELECT jsonb_build_object('n', g) "
            "FROM generate_series(1, $1) g",
            args.jobs,
        )
        await conn.execute("VACUUM ANALYZE jobs")
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *(loop(dsn, w, args.batch, args.mode) for w in range(args.connections))
        )
        elapsed = time.perf_counter() - t0
        done = await conn.fetchval("SELECT count(*) FROM jobs WHERE state = 'done'")
    finally:
        await conn.close()
    result: dict[str, object] = {
        "system": "ceiling-skip-locked",
        "scenario": f"claim-{args.mode}-batch{args.batch}",
        "jobs_per_s": round(args.jobs / elapsed, 1),
        "n": args.jobs,
        "completed": done,
        "connections": args.connections,
        "elapsed_s": round(elapsed, 3),
    }
    if done != args.jobs or sum(counts) != args.jobs:
        result["error"] = f"{done} rows done, loops counted {sum(counts)}, expected {args.jobs}"
    return result


def main() -> int:
    p = argparse.ArgumentParser(description="raw asyncpg SKIP LOCKED claim loop")
    p.add_argument("--batch", type=int, default=1, help="rows per claim statement (1 or 50)")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--mode", choices=["two-step", "one-step"], default="two-step")
    p.add_argument("--timeout", type=float, default=115.0)
    args = p.parse_args()
    stub = {"system": "ceiling-skip-locked", "scenario": f"claim-{args.mode}-batch{args.batch}"}
    benchlib.install_guards(args.timeout, stub)

    def go() -> int:
        result = asyncio.run(run(args))
        benchlib.emit(result)
        return 1 if "error" in result else 0

    return benchlib.main_guard(go, stub)


if __name__ == "__main__":
    sys.exit(main())
