"""Dispatch latency, open loop: submit -> lease received (``dispatch``, simulated workers) and
submit -> job process started (``dispatch-real``, a real ``berth worker``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
from typing import Any

import common
from common import BerthServer, Profiler, benchlib

from scenarios.shared import (
    WARMUP_JOBS,
    Api,
    job,
    marks_dir,
    mint,
    open_loop,
    stub,
    tokens_file,
    wait_attached,
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``dispatch``: simulated workers on an idle queue, jobs submitted at ``--rate``."""
    collector = benchlib.make_collector()
    server = BerthServer("dispatch", {"pools": {"sim": {"slots": {"default": args.slots}}}})
    server.start()
    api = Api(server)
    try:
        tokens = tokens_file(server, "disp", args.workers)
        sim, sim_log = common.spawn_sim(
            server, tokens, label="sim", extra=["--probe", "--seconds", str(args.timeout)]
        )
        if not wait_attached(server, args.workers, 30.0):
            return {**stub(args), "error": "simulated workers did not attach"}
        for _ in range(WARMUP_JOBS):
            api.submit(job(["true"], "sim"))
        if not collector.wait_jobs(WARMUP_JOBS, 30.0):
            return {**stub(args), "error": "warm-up jobs were not leased"}
        collector.jobs.clear()
        with Profiler(server, "dispatch"):
            submitted, submit_stats = open_loop(api, args, lambda _k: job(["true"], "sim"))
        n = len(submitted)
        collector.wait_jobs(n, 15.0)
        lat = [r.started - submitted[j] for j, r in collector.jobs.items() if j in submitted]
        states = asyncio.run(common.wait_states(server.db_url, "succeeded", n + WARMUP_JOBS, 15))
        common.interrupt(sim)
        sim_result = common.last_json(sim_log)
        result = {
            **stub(args),
            **benchlib.latency_summary(lat),
            "n": len(lat),
            "expected": n,
            "rate": args.rate,
            "seconds": args.seconds,
            **submit_stats,
            "workers": args.workers,
            "slots": args.slots,
            "succeeded": asyncio.run(common.job_states(server.db_url)).get("succeeded", 0),
            "duplicates": collector.duplicates,
            "sim_stale": sim_result.get("stale"),
        }
        if len(lat) < n:
            result["error"] = f"only {len(lat)} of {n} leases received within 15 s"
        elif not states[0]:
            result["error"] = "not every job succeeded"
        return result
    finally:
        api.close()
        benchlib.stop_all()
        collector.stop()


def run_real(args: argparse.Namespace) -> dict[str, Any]:
    """``dispatch-real``: the same against one real ``berth worker``."""
    server = BerthServer("dispatch-real", {"pools": {"real": {"slots": {"default": args.slots}}}})
    server.start()
    api = Api(server)
    # Each job runs as a uid of its own with a private /tmp: it writes its stamp as a file of
    # its own in a sticky folder every uid may create files in (one shared file would be
    # root's, or the first job's, and the others could not append to it).
    marks = marks_dir("dispatch-real-")

    def body(k: int) -> dict[str, Any]:
        # bash's $EPOCHREALTIME: the wall clock when the job's process runs, no fork for `date`.
        return job(["bash", "-c", f"echo $EPOCHREALTIME > {marks}/{k}.t"], "real")

    def lines() -> dict[int, float]:
        out = {}
        for path in marks.glob("*.t"):
            with contextlib.suppress(ValueError):
                out[int(path.stem)] = float(path.read_text().split()[0])
        return out

    try:
        tokens = mint(server, "real", 1)
        common.spawn_real_worker(server, tokens[0][1], "real", "w0")
        if not wait_attached(server, 1, 30.0):
            return {**stub(args), "error": "the real worker did not attach"}
        for k in range(WARMUP_JOBS):
            api.submit(body(-1 - k))
        ok, _ = asyncio.run(common.wait_states(server.db_url, "succeeded", WARMUP_JOBS, 30))
        if not ok:
            states = asyncio.run(common.job_states(server.db_url))
            return {**stub(args), "error": f"warm-up jobs did not run: {states}"}
        submitted_by_id, submit_stats = open_loop(api, args, body)
        # ids were assigned in submission order, k = 0, 1, ...
        submitted = dict(enumerate(submitted_by_id[i] for i in sorted(submitted_by_id)))
        n = len(submitted)
        done, _ = asyncio.run(common.wait_states(server.db_url, "succeeded", n + WARMUP_JOBS, 30))
        started = lines()
        lat = [started[k] - submitted[k] for k in submitted if k in started]
        result = {
            **stub(args),
            **benchlib.latency_summary(lat),
            "n": len(lat),
            "expected": n,
            "rate": args.rate,
            "seconds": args.seconds,
            **submit_stats,
            "slots": args.slots,
            "measures": "submit -> job process started (bash $EPOCHREALTIME)",
        }
        if len(lat) < n or not done:
            result["error"] = f"only {len(lat)} of {n} jobs started"
        return result
    finally:
        api.close()
        benchlib.stop_all()
        shutil.rmtree(marks, ignore_errors=True)
