"""The scenario driver shared by every peer bench (standard library only).

A peer script supplies a :class:`Peer` (how to reset its storage, submit one job, enqueue many,
start a worker process, and count completions in the library's own terms). This module runs the
two scenarios identically for all of them, so differences in the numbers come from the libraries
and not from the harness:

``dispatch``
    One idle worker process attached. Jobs are submitted open-loop at ``--rate`` per second for
    ``--seconds``: the schedule is fixed in advance and never waits for completions. Each job
    carries ``time.time()`` taken just before the submit call; the task body's first statement
    takes ``time.time()`` again, and the difference is the dispatch latency (submit -> body
    started). Before the measured window a few warm-up jobs make sure the worker is listening.

``drain``
    ``--jobs`` no-op jobs are enqueued in bulk first, then the worker processes are started.
    Throughput is ``jobs / (last body finished - first worker ready)``, where "ready" is stamped
    by the worker process right before it enters the library's worker loop (so interpreter and
    import time are excluded, the library's own start-up is included). ``steady_jobs_per_s``
    uses the first body start instead. Completion is then verified through the library's own
    state (``completed``), which also yields ``acked_s``, the time until the library recorded
    every job as done.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import benchlib

WARMUP_JOBS = 3


class Peer(Protocol):
    system: str

    async def reset(self) -> None:
        """Drop and recreate this peer's database/keyspace, install its schema."""

    async def open(self) -> None:
        """Connect the submitting side."""

    async def close(self) -> None: ...

    async def submit(self, job: int, submitted: float) -> None:
        """Submit one job whose body calls ``benchlib.probe_job(job, submitted, started)``."""

    async def enqueue_many(self, first: int, count: int) -> None:
        """Enqueue ``count`` jobs numbered from ``first``, as fast as the library allows."""

    async def after_enqueue(self) -> None:
        """Bring the store to steady state before workers start (e.g. ``ANALYZE`` the tables)."""

    async def completed(self, expected: int) -> int:
        """How many of ``expected`` jobs the library itself regards as done."""

    def worker_command(self, args: argparse.Namespace, index: int) -> list[str]:
        """argv of one worker process (usually this script with ``--role worker``)."""


@dataclass(frozen=True)
class Defaults:
    workers: int
    concurrency: int


def parser(system: str, defaults: Defaults) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=f"{system} dispatch/drain benchmark")
    p.add_argument("--scenario", choices=["dispatch", "drain"], default="dispatch")
    p.add_argument("--seconds", type=float, default=20.0, help="dispatch: length of the window")
    p.add_argument("--rate", type=float, default=50.0, help="dispatch: jobs per second")
    p.add_argument("--jobs", type=int, default=20_000, help="drain: jobs enqueued up front")
    p.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="drain: worker processes (dispatch always uses one)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=defaults.concurrency,
        help="jobs in flight per worker process",
    )
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="drain: skip the ANALYZE after the bulk enqueue (cold planner statistics)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=115.0,
        help="hard wall-clock limit for the whole run, seconds",
    )
    # Internal: the same script is re-executed as the worker process.
    p.add_argument("--role", choices=["bench", "worker"], default="bench", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    return p


def _stub(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    return {"system": peer.system, "scenario": args.scenario}


def _spawn_workers(peer: Peer, args: argparse.Namespace, count: int) -> None:
    logs = benchlib.log_dir(peer.system)
    for index in range(count):
        benchlib.spawn(
            peer.worker_command(args, index),
            log_path=logs / f"{args.scenario}-worker-{index}.log",
        )


async def _wait(fn: Any, *fn_args: Any) -> bool:
    # The collector's waits block on a condition variable; keep the event loop (and with it the
    # client library's connection housekeeping) free while they do.
    return bool(await asyncio.to_thread(fn, *fn_args))


async def dispatch(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    collector = benchlib.make_collector()
    await peer.reset()
    await peer.open()
    try:
        _spawn_workers(peer, args, 1)
        if not await _wait(collector.wait_ready, 1, 30.0):
            return {**_stub(peer, args), "error": "worker never reported ready"}
        for k in range(WARMUP_JOBS):
            await peer.submit(-1 - k, time.time())
        if not await _wait(collector.wait_jobs, WARMUP_JOBS, 30.0):
            return {**_stub(peer, args), "error": "warm-up jobs did not run"}
        collector.jobs.clear()

        schedule = benchlib.pace(args.rate, args.seconds)
        submit_s: list[float] = []
        max_lag = 0.0
        t0 = time.monotonic() + 0.05
        for job, offset in enumerate(schedule):
            delay = t0 + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                max_lag = max(max_lag, -delay)  # open loop: a late submit is not skipped
            submitted = time.time()
            await peer.submit(job, submitted)
            submit_s.append(time.time() - submitted)
        n = len(schedule)
        await _wait(collector.wait_jobs, n, 15.0)
        records = [r for j, r in collector.jobs.items() if j >= 0]
        result = {
            **_stub(peer, args),
            **benchlib.latency_summary(r.started - r.submitted for r in records),
            "n": len(records),
            "expected": n,
            "rate": args.rate,
            "seconds": args.seconds,
            "submit_p50_ms": benchlib.latency_summary(submit_s)["p50_ms"],
            "submit_p99_ms": benchlib.latency_summary(submit_s)["p99_ms"],
            "max_submit_lag_ms": round(max_lag * 1000, 3),
            "duplicates": collector.duplicates,
        }
        if len(records) < n:
            result["error"] = f"only {len(records)} of {n} jobs started within 15 s"
        return result
    finally:
        benchlib.stop_all()
        await peer.close()
        collector.stop()


async def drain(peer: Peer, args: argparse.Namespace, started_at: float) -> dict[str, Any]:
    collector = benchlib.make_collector()
    n = args.jobs
    await peer.reset()
    await peer.open()
    try:
        t_enqueue = time.time()
        await peer.enqueue_many(0, n)
        enqueue_s = time.time() - t_enqueue
        if not args.no_analyze:
            await peer.after_enqueue()

        _spawn_workers(peer, args, args.workers)
        if not await _wait(collector.wait_ready, args.workers, 30.0):
            return {**_stub(peer, args), "error": "workers never reported ready"}
        # Leave room under the hard timeout for verification and shutdown.
        budget = max(5.0, args.timeout - (time.monotonic() - started_at) - 20.0)
        done = await _wait(collector.wait_jobs, n, budget)
        ready = min(collector.ready.values())
        records = list(collector.jobs.values())
        if not records:
            return {**_stub(peer, args), "error": "no job ran"}
        first_start = min(r.started for r in records)
        last_finish = max(r.finished for r in records)

        # Verify through the library: completions may be recorded in batches after the body ran.
        completed = 0
        acked_at = None
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            completed = await peer.completed(n)
            if completed >= n:
                acked_at = time.time()
                break
            await asyncio.sleep(0.02)

        result: dict[str, Any] = {
            **_stub(peer, args),
            "jobs_per_s": round(len(records) / (last_finish - ready), 1),
            "n": len(records),
            "expected": n,
            "completed": completed,
            "steady_jobs_per_s": round(
                (len(records) - 1) / max(1e-9, last_finish - first_start), 1
            ),
            "drain_s": round(last_finish - ready, 3),
            "acked_s": round(acked_at - ready, 3) if acked_at else None,
            "enqueue_jobs_per_s": round(n / enqueue_s, 1),
            "analyzed": not args.no_analyze,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "duplicates": collector.duplicates,
        }
        if not done or len(records) < n:
            result["error"] = f"only {len(records)} of {n} jobs ran within {budget:.0f} s"
        elif completed < n:
            result["error"] = f"library reports {completed} of {n} completed"
        return result
    finally:
        benchlib.stop_all()
        await peer.close()
        collector.stop()


def run(peer: Peer, args: argparse.Namespace) -> int:
    """Entry point for the bench role: guard the process, run the scenario, print the result."""
    started_at = time.monotonic()
    stub = _stub(peer, args)
    benchlib.install_guards(args.timeout, stub)

    def go() -> int:
        if args.scenario == "dispatch":
            result = asyncio.run(dispatch(peer, args))
        else:
            result = asyncio.run(drain(peer, args, started_at))
        benchlib.emit(result)
        return 1 if "error" in result else 0

    return benchlib.main_guard(go, stub)


def script_command(script: str, args: argparse.Namespace, index: int) -> list[str]:
    """argv that re-runs ``script`` as worker ``index`` with the same settings."""
    return [
        sys.executable,
        str(Path(script).resolve()),
        "--role",
        "worker",
        "--index",
        str(index),
        "--scenario",
        args.scenario,
        "--concurrency",
        str(args.concurrency),
    ]
