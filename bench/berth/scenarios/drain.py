"""Drain: ``--jobs`` queued by batched submits, then simulated workers drain them; jobs/s."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import common
from common import BerthServer, Profiler, benchlib

from scenarios.shared import Api, job, stub, tokens_file


def run(args: argparse.Namespace, started_at: float) -> dict[str, Any]:
    """``drain``: ``--workers`` simulated workers with ``--slots`` each empty the queue."""
    n = args.jobs
    config = {"pools": {"sim": {"slots": {"default": args.slots}}}}
    server = BerthServer("drain", config)
    server.start()
    api = Api(server)
    try:
        tokens = tokens_file(server, "drain", args.workers)
        t_enqueue = time.time()
        api.submit_many([job(["true"], "sim")] * n)
        enqueue_s = time.time() - t_enqueue
        if not args.no_analyze:
            benchlib.psql(server.database, "ANALYZE")
        budget = max(5.0, args.timeout - (time.monotonic() - started_at) - 20.0)
        cpu = server.cpu_seconds()
        with Profiler(server, "drain"):
            sim, sim_log = common.spawn_sim(
                server,
                tokens,
                label="sim",
                extra=["--exit-after-results", str(n), "--seconds", str(budget)],
            )
            finished = common.wait_proc(sim, budget + 15.0)
        cpu = server.cpu_seconds() - cpu
        if not finished:
            common.interrupt(sim)
        sim_result = common.last_json(sim_log)
        states = asyncio.run(common.job_states(server.db_url))
        succeeded = states.get("succeeded", 0)
        ready = sim_result.get("started_wall")
        last = sim_result.get("last_result_ack_wall")
        first = sim_result.get("first_lease_wall")
        result: dict[str, Any] = {**stub(args)}
        if ready and last and first:
            acks = sim_result.get("result_acks", 0)
            result.update(
                jobs_per_s=round(acks / (last - ready), 1),
                steady_jobs_per_s=round((acks - 1) / max(1e-9, last - first), 1),
                drain_s=round(last - ready, 3),
            )
        result.update(
            n=sim_result.get("result_acks", 0),
            expected=n,
            completed=succeeded,
            states=states,
            enqueue_jobs_per_s=round(n / enqueue_s, 1),
            enqueue_fallbacks=api.fallbacks,
            analyzed=not args.no_analyze,
            workers=args.workers,
            slots=args.slots,
            attach_s=sim_result.get("attach_s"),
            stale=sim_result.get("stale"),
            server_cpu_ms_per_job=round(1000 * cpu / max(1, succeeded), 3),
        )
        if succeeded < n:
            result["error"] = f"{succeeded} of {n} jobs succeeded within {budget:.0f} s"
        elif "jobs_per_s" not in result:
            result["error"] = f"simulator reported no result: {sim_result.get('errors')}"
        return result
    finally:
        api.close()
        benchlib.stop_all()
