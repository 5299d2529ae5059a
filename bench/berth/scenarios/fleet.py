"""Fleet: ``--workers`` simulated workers attached at once, heartbeating every ``--heartbeat``
s; heartbeat ack latency, server CPU and memory per worker over ``--window`` s."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

import common
import psutil
from common import BerthServer, Profiler, benchlib

from scenarios.shared import stub, tokens_file


def run(args: argparse.Namespace, started_at: float) -> dict[str, Any]:
    """``fleet``: attach the fleet, then measure over the window."""
    n = args.workers
    common.raise_fd_limit(max(4096, 2 * n + 1024))  # the server inherits it
    config = {
        # The kill grace must fit inside two heartbeats (config check); no job runs here.
        "executor": {"heartbeat_seconds": args.heartbeat, "kill_grace_seconds": args.heartbeat},
        "pools": {"sim": {"slots": {"default": 1}}},
    }
    server = BerthServer(f"fleet-{n}", config)
    server.start()
    try:
        tokens = tokens_file(server, "fleet", n)
        proc = psutil.Process(server.pid)
        time.sleep(1.0)
        rss0 = proc.memory_info().rss
        stats_file = server.home / "fleet-stats.json"
        budget = args.timeout - (time.monotonic() - started_at) - 15.0
        sim, sim_log = common.spawn_sim(
            server,
            tokens,
            label="sim",
            extra=[
                "--seconds",
                str(budget),
                "--stats-file",
                str(stats_file),
                "--connect-concurrency",
                str(args.connect_concurrency),
                *(["--no-compression"] if args.no_compression else []),
            ],
        )
        t_sim = time.monotonic()
        attach_budget = budget - args.window - 5.0
        attached = 0
        deadline = time.monotonic() + attach_budget
        while time.monotonic() < deadline:
            attached = asyncio.run(common.attached_workers(server.db_url))
            if attached >= n:
                break
            time.sleep(0.25)
        attach_s = time.monotonic() - t_sim
        time.sleep(1.0)
        sim_ps = psutil.Process(sim.pid)
        cpu0, sim_cpu0 = proc.cpu_times(), sim_ps.cpu_times()
        wall0, mono0 = time.time(), time.monotonic()
        rss_max = 0
        with Profiler(server, f"fleet-{n}"):
            while time.monotonic() - mono0 < args.window:
                rss_max = max(rss_max, proc.memory_info().rss)
                time.sleep(0.5)
        cpu1, sim_cpu1 = proc.cpu_times(), sim_ps.cpu_times()
        wall1, mono1 = time.time(), time.monotonic()
        rss1 = proc.memory_info().rss
        attached_end = asyncio.run(common.attached_workers(server.db_url))
        common.interrupt(sim, timeout=30.0)
        sim_result = common.last_json(sim_log)
        window_acks: list[float] = []
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(stats_file.read_text())
            # beats sent in the window whose ack came back by its end
            window_acks = [
                lat for sent, lat in data["acks"] if wall0 <= sent and sent + lat <= wall1
            ]
        dt = mono1 - mono0
        cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        sim_cpu = (sim_cpu1.user + sim_cpu1.system) - (sim_cpu0.user + sim_cpu0.system)
        summary = benchlib.latency_summary(window_acks)
        result = {
            **stub(args),
            "workers": n,
            "attached": attached_end,
            "attach_s": round(attach_s, 2),
            "heartbeat_s": args.heartbeat,
            "window_s": round(dt, 2),
            "beats_acked": len(window_acks),
            "expected_beats": int(attached_end * dt / args.heartbeat),
            "ack_p50_ms": summary["p50_ms"],
            "ack_p95_ms": summary["p95_ms"],
            "ack_p99_ms": summary["p99_ms"],
            "ack_max_ms": summary["max_ms"],
            "server_cpu_cores": round(cpu / dt, 3),
            "sim_cpu_cores": round(sim_cpu / dt, 3),
            "rss_base_mb": round(rss0 / 2**20, 1),
            "rss_mb": round(rss1 / 2**20, 1),
            "rss_max_mb": round(rss_max / 2**20, 1),
            "kb_per_worker": round((rss1 - rss0) / 1024 / max(1, attached_end), 1),
            "compression": not args.no_compression,
            "sim_disconnected": sim_result.get("disconnected"),
            "sim_errors": sim_result.get("errors", [])[:3],
        }
        if attached_end < n:
            # Not a failure of the run: the numbers hold for the workers that did attach (the
            # table shows how many); attaching is the bottleneck and attach_s says how slow.
            result["partial"] = f"only {attached_end} of {n} workers attached within the budget"
        if not window_acks:
            result["error"] = "no heartbeat was acked in the window"
        return result
    finally:
        benchlib.stop_all()
