"""Celery (Redis broker) peer bench: dispatch latency and drain throughput (``bench/PEERS.md``).

Runs inside ``bench/.venvs/celery``. Uses a dedicated Redis database (``BENCH_CELERY_REDIS_DB``,
default 15), flushed per run; redis-server is started if nothing answers. The worker is this
script re-executed with ``--role worker``, calling ``app.worker_main`` with the prefork pool and
``concurrency`` children. Results are ignored (Celery's default without a result backend), so a
"completed" job is one the worker consumed from the queue and acknowledged; gossip, mingle and
heartbeat are off because they serve multi-worker clusters and only add start-up time here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib
import celery
import peerharness
import redis

REDIS_DB = int(os.environ.get("BENCH_CELERY_REDIS_DB", "15"))
QUEUE = "bench"
# One worker with a prefork child per core: Celery's own default concurrency on this machine.
DEFAULTS = peerharness.Defaults(workers=1, concurrency=2)


def broker_url() -> str:
    return f"redis://{benchlib.REDIS_HOST}:{benchlib.REDIS_PORT}/{REDIS_DB}"


app = celery.Celery("bench_celery", broker=broker_url())
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench_noop")
def noop(job: int, submitted: float) -> None:
    started = time.time()
    benchlib.probe_job(job, submitted, started)


class CeleryPeer:
    system = "celery"

    def __init__(self) -> None:
        self.redis = redis.Redis(host=benchlib.REDIS_HOST, port=benchlib.REDIS_PORT, db=REDIS_DB)

    async def reset(self) -> None:
        benchlib.ensure_redis()
        self.redis.flushdb()

    async def open(self) -> None:
        # Connect the producer before the measured window so the first submit is not a dial.
        with app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=3)

    async def close(self) -> None:
        app.pool.force_close_all()

    async def submit(self, job: int, submitted: float) -> None:
        # apply_async is synchronous; blocking the loop for it is fine, nothing else runs there.
        noop.apply_async((job, submitted))

    async def enqueue_many(self, first: int, count: int) -> None:
        # Celery has no bulk enqueue; one producer reused for every publish is its fastest path.
        with app.producer_or_acquire() as producer:
            for job in range(first, first + count):
                noop.apply_async((job, time.time()), producer=producer)

    async def after_enqueue(self) -> None:
        pass  # Redis lists have no planner

    async def completed(self, expected: int) -> int:
        # Without results, the library's own record is the broker: nothing left in the queue and
        # nothing delivered-but-unacknowledged means every job was consumed and acked.
        left = int(self.redis.llen(QUEUE)) + int(self.redis.hlen("unacked"))
        return expected - left

    def worker_command(self, args: argparse.Namespace, index: int) -> list[str]:
        return peerharness.script_command(__file__, args, index)


def run_worker(args: argparse.Namespace) -> int:
    benchlib.probe_ready()
    # worker_main installs Celery's own SIGTERM handling (warm shutdown).
    app.worker_main(
        [
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(args.concurrency),
            "--queues",
            QUEUE,
            "--hostname",
            f"bench{args.index}@%h",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )
    return 0


def main() -> int:
    args = peerharness.parser("celery", DEFAULTS).parse_args()
    if args.role == "worker":
        return run_worker(args)
    return peerharness.run(CeleryPeer(), args)


if __name__ == "__main__":
    sys.exit(main())
