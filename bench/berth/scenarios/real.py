"""Real jobs: ``true`` on real ``berth worker`` processes, submit -> all succeeded; jobs/s."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import common
from common import BerthServer, benchlib

from scenarios.shared import Api, job, mint, stub, wait_attached


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``real``: ``--jobs`` of ``true`` on ``--workers`` real workers."""
    server = BerthServer("real", {"pools": {"real": {"slots": {"default": args.slots}}}})
    server.start()
    api = Api(server)
    try:
        tokens = mint(server, "real", args.workers)
        for i, (_, token) in enumerate(tokens):
            common.spawn_real_worker(server, token, "real", f"w{i}")
        if not wait_attached(server, args.workers, 30.0):
            return {**stub(args), "error": "real workers did not attach"}
        api.submit(job(["true"], "real"))  # warm-up: imports on the worker's first job
        asyncio.run(common.wait_states(server.db_url, "succeeded", 1, 30))
        n = args.jobs
        t0 = time.time()
        api.submit_many([job(["true"], "real")] * n)
        ok, t1 = asyncio.run(common.wait_states(server.db_url, "succeeded", n + 1, 100))
        states = asyncio.run(common.job_states(server.db_url))
        result = {
            **stub(args),
            "jobs_per_s": round(n / (t1 - t0), 1),
            "n": n,
            "completed": states.get("succeeded", 0) - 1,
            "states": states,
            "workers": args.workers,
            "slots": args.slots,
        }
        if not ok:
            result["error"] = f"only {states.get('succeeded', 0) - 1} of {n} succeeded"
        return result
    finally:
        api.close()
        benchlib.stop_all()
