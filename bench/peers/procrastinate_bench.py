"""procrastinate peer bench: dispatch latency and drain throughput (see ``bench/PEERS.md``).

Runs inside ``bench/.venvs/procrastinate``. Uses a dedicated database ``bench_procrastinate``,
dropped and recreated per run. Workers are this script re-executed with ``--role worker``: one
asyncio process each, running an async no-op task with ``concurrency`` jobs in flight. Library
defaults are kept otherwise (LISTEN/NOTIFY on, jobs kept in the table after completion).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib
import peerharness
import procrastinate

DATABASE = "bench_procrastinate"
QUEUE = "bench"
# Two async worker processes (one per core) with ten jobs in flight each: procrastinate fetches one
# job per query, so in-process concurrency is what hides the round trips.
DEFAULTS = peerharness.Defaults(workers=2, concurrency=10)


def make_app(concurrency: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=benchlib.pg_url(DATABASE),
        # Enough connections for every job in flight plus the listener and the heartbeat.
        min_size=2,
        max_size=concurrency + 3,
    )
    app = procrastinate.App(connector=connector)

    @app.task(name="bench_noop", queue=QUEUE)
    async def noop(job: int, submitted: float) -> None:
        started = time.time()
        benchlib.probe_job(job, submitted, started)

    return app


class ProcrastinatePeer:
    system = "procrastinate"

    def __init__(self) -> None:
        self.app = make_app(concurrency=2)

    async def reset(self) -> None:
        benchlib.recreate_database(DATABASE)
        async with self.app.open_async():
            await self.app.schema_manager.apply_schema_async()

    async def open(self) -> None:
        await self.app.open_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def submit(self, job: int, submitted: float) -> None:
        await self.app.tasks["bench_noop"].defer_async(job=job, submitted=submitted)

    async def enqueue_many(self, first: int, count: int) -> None:
        task = self.app.tasks["bench_noop"]
        chunk = 1000  # the library's batch insert; chunks keep each statement moderate
        for start in range(first, first + count, chunk):
            now = time.time()
            await task.batch_defer_async(
                *(
                    {"job": j, "submitted": now}
                    for j in range(start, min(start + chunk, first + count))
                )
            )

    async def after_enqueue(self) -> None:
        # A burst of inserts leaves the planner without statistics until autovacuum gets to the
        # table (a minute or more); production queues run with statistics, so measure that way.
        benchlib.psql(DATABASE, "ANALYZE")

    async def completed(self, expected: int) -> int:
        del expected
        out = benchlib.psql(
            DATABASE, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        return int(out)

    def worker_command(self, args: argparse.Namespace, index: int) -> list[str]:
        return peerharness.script_command(__file__, args, index)


def run_worker(args: argparse.Namespace) -> int:
    app = make_app(args.concurrency)

    async def go() -> None:
        async with app.open_async():
            benchlib.probe_ready()
            # The library's own SIGTERM handling stops the worker gracefully.
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=args.concurrency,
                name=f"bench-{args.index}",
                wait=True,
            )

    asyncio.run(go())
    return 0


def main() -> int:
    args = peerharness.parser("procrastinate", DEFAULTS).parse_args()
    if args.role == "worker":
        return run_worker(args)
    return peerharness.run(ProcrastinatePeer(), args)


if __name__ == "__main__":
    sys.exit(main())
