"""Submit throughput: one job per request (``--concurrency`` keep-alive connections, wrk when
installed, else httpx) and batches of ``--batch``; jobs/s counted in the database."""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import time
from typing import Any

import common
import httpx
from common import BerthServer, Profiler, benchlib

from scenarios.shared import Api, job, stub

WRK_LUA = """
wrk.method = "POST"
wrk.body = '{"command": ["true"], "pool": "sim"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def _single_wrk(server: BerthServer, args: argparse.Namespace) -> dict[str, Any]:
    script = server.home / "submit.lua"
    script.write_text(WRK_LUA % server.admin_token)
    before = asyncio.run(common.job_states(server.db_url)).get("queued", 0)
    cpu = server.cpu_seconds()
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{args.concurrency}",
            f"-d{args.seconds:g}s",
            "--latency",
            "-s",
            str(script),
            f"{server.url}/api/v1/jobs",
        ],
        capture_output=True,
        text=True,
        timeout=args.seconds + 30,
        check=False,
    ).stdout
    cpu = server.cpu_seconds() - cpu
    after = asyncio.run(common.job_states(server.db_url)).get("queued", 0)
    m = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", out)
    if not m:
        raise RuntimeError(f"unexpected wrk output: {out[-400:]}")
    secs = float(m.group(2)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(3)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p = {
        q: re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)", out) for q in ("50.000", "99.000", "50", "99")
    }

    def ms(key: str) -> float | None:
        hit = p.get(key + ".000") or p.get(key)
        if hit is None:
            return None
        return float(hit.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[hit.group(2)]

    return {
        "single_jobs_per_s": round((after - before) / secs, 1),
        "single_jobs": after - before,
        "single_errors": int(non2xx.group(1)) if non2xx else 0,
        "single_p50_ms": ms("50"),
        "single_p99_ms": ms("99"),
        "single_server_cpu_ms_per_job": round(1000 * cpu / max(1, after - before), 3),
        "single_client": "wrk",
    }


async def _single_httpx(server: BerthServer, args: argparse.Namespace) -> dict[str, Any]:
    body = job(["true"], "sim")
    lat: list[float] = []
    errors = 0
    deadline = time.monotonic() + args.seconds
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as client:

        async def loop() -> None:
            nonlocal errors
            while time.monotonic() < deadline:
                t = time.monotonic()
                r = await client.post("/api/v1/jobs", json=body)
                lat.append(time.monotonic() - t)
                errors += r.status_code != 201

        t0 = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(args.concurrency)))
        elapsed = time.monotonic() - t0
    summary = benchlib.latency_summary(lat)
    return {
        "single_jobs_per_s": round((len(lat) - errors) / elapsed, 1),
        "single_jobs": len(lat) - errors,
        "single_errors": errors,
        "single_p50_ms": summary["p50_ms"],
        "single_p99_ms": summary["p99_ms"],
        "single_client": "httpx",
    }


async def _batches(server: BerthServer, args: argparse.Namespace) -> dict[str, Any]:
    body = [job(["true"], "sim")] * args.batch
    requests = max(1, args.jobs // args.batch)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    errors = 0
    lat: list[float] = []
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers(), timeout=60
    ) as client:

        async def loop() -> None:
            nonlocal errors
            while not queue.empty():
                queue.get_nowait()
                t = time.monotonic()
                r = await client.post("/api/v1/jobs", json=body)
                lat.append(time.monotonic() - t)
                errors += r.status_code != 201

        t0, cpu = time.monotonic(), server.cpu_seconds()
        await asyncio.gather(*(loop() for _ in range(args.batch_concurrency)))
        elapsed, cpu = time.monotonic() - t0, server.cpu_seconds() - cpu
    summary = benchlib.latency_summary(lat)
    return {
        "batch_jobs_per_s": round((requests - errors) * args.batch / elapsed, 1),
        "batch_jobs": (requests - errors) * args.batch,
        "batch_errors": errors,
        "batch_size": args.batch,
        "batch_p50_ms": summary["p50_ms"],
        "batch_server_cpu_ms_per_job": round(
            1000 * cpu / max(1, (requests - errors) * args.batch), 3
        ),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``submit``: single submits for ``--seconds``, then ``--jobs`` in batches."""
    server = BerthServer("submit", {"pools": {"sim": {"slots": {"default": 1}}}})
    server.start()
    try:
        Api(server).submit(job(["true"], "sim"))  # warm the app (imports, pools, plans)
        with Profiler(server, "submit"):
            if shutil.which("wrk") and not args.python_client:
                single = _single_wrk(server, args)
            else:
                single = asyncio.run(_single_httpx(server, args))
            batch = asyncio.run(_batches(server, args))
        result = {
            **stub(args),
            **single,
            **batch,
            "concurrency": args.concurrency,
            "batch_concurrency": args.batch_concurrency,
        }
        if single["single_errors"] or batch["batch_errors"] or not single["single_jobs"]:
            result["error"] = "some submissions failed"
        return result
    finally:
        benchlib.stop_all()
