"""pgqueuer peer bench: dispatch latency and drain throughput (see ``bench/PEERS.md``).

Runs inside ``bench/.venvs/pgqueuer``. Uses a dedicated database ``bench_pgqueuer``, dropped and
recreated per run, with pgqueuer's schema installed through its own ``Queries.install``. Workers
are this script re-executed with ``--role worker``: one ``QueueManager`` per process on an asyncpg
connection, dequeuing ``concurrency`` jobs per batch (the library's ``batch_size``). Library
defaults are kept otherwise (LISTEN/NOTIFY, buffered status logging).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import benchlib
import peerharness
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

DATABASE = "bench_pgqueuer"
ENTRYPOINT = "bench_noop"
# Two processes, one per core; batch_size 10 is pgqueuer's default dequeue batch.
DEFAULTS = peerharness.Defaults(workers=2, concurrency=10)


def encode(job: int, submitted: float) -> bytes:
    return f"{job} {submitted!r}".encode()


class PgqueuerPeer:
    system = "pgqueuer"

    def __init__(self) -> None:
        self.conn: asyncpg.Connection | None = None
        self.queries: Queries | None = None

    async def reset(self) -> None:
        benchlib.recreate_database(DATABASE)
        conn = await asyncpg.connect(benchlib.pg_url(DATABASE))
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def open(self) -> None:
        self.conn = await asyncpg.connect(benchlib.pg_url(DATABASE))
        self.queries = Queries(AsyncpgDriver(self.conn))

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    async def submit(self, job: int, submitted: float) -> None:
        assert self.queries is not None
        await self.queries.enqueue(ENTRYPOINT, encode(job, submitted), 0)

    async def enqueue_many(self, first: int, count: int) -> None:
        assert self.queries is not None
        chunk = 1000  # pgqueuer's list form is one multi-row insert per call
        for start in range(first, first + count, chunk):
            jobs = range(start, min(start + chunk, first + count))
            now = time.time()
            await self.queries.enqueue(
                [ENTRYPOINT] * len(jobs), [encode(j, now) for j in jobs], [0] * len(jobs)
            )

    async def after_enqueue(self) -> None:
        # A burst of inserts leaves the planner without statistics until autovacuum gets to the
        # table (a minute or more); production queues run with statistics, so measure that way.
        benchlib.psql(DATABASE, "ANALYZE")

    async def completed(self, expected: int) -> int:
        # pgqueuer deletes a finished job from the queue table (moving it to the log), so what is
        # no longer queued is done.
        remaining = int(benchlib.psql(DATABASE, "SELECT count(*) FROM pgqueuer"))
        return expected - remaining

    def worker_command(self, args: argparse.Namespace, index: int) -> list[str]:
        return peerharness.script_command(__file__, args, index)


def run_worker(args: argparse.Namespace) -> int:
    async def go() -> None:
        conn = await asyncpg.connect(benchlib.pg_url(DATABASE))
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            started = time.time()
            assert job.payload is not None
            number, submitted = job.payload.decode().split()
            benchlib.probe_job(int(number), float(submitted), started)

        loop = asyncio.get_running_loop()
        # pgqueuer leaves signal handling to the application: setting the shutdown event is its
        # documented graceful stop.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, qm.shutdown.set)
        benchlib.probe_ready()
        try:
            await qm.run(batch_size=args.concurrency)
        finally:
            await conn.close()

    asyncio.run(go())
    return 0


def main() -> int:
    args = peerharness.parser("pgqueuer", DEFAULTS).parse_args()
    if args.role == "worker":
        return run_worker(args)
    return peerharness.run(PgqueuerPeer(), args)


if __name__ == "__main__":
    sys.exit(main())
