"""Failover: kill -9 of a real worker holding a job; seconds until the job starts again, for a
restarted worker (the fast path) and a silent one (the configured window)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import common
from common import BerthServer, benchlib

from scenarios.shared import Api, job, marks_dir, mint, stub, wait_attached


def _starts(path: Path) -> list[tuple[int, float]]:
    """(pid, wall clock) of each start of the job stamping `path`, in order.

    One file per attempt (`path.<attempt>`): each attempt may run as another uid, which may not
    append to a file of the first's.
    """
    out = []
    for stamp in path.parent.glob(f"{path.name}.*"):
        with contextlib.suppress(OSError, ValueError):
            pid, t = stamp.read_text().split()
            out.append((int(pid), float(t)))
    return sorted(out, key=lambda s: s[1])


def _wait_starts(path: Path, n: int, timeout: float) -> list[tuple[int, float]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = _starts(path)
        if len(got) >= n:
            return got
        time.sleep(0.01)
    return _starts(path)


def _kill_jobs(path: Path) -> None:
    for pid, _ in _starts(path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``failover``: the fast path, then the silent one, on one server."""
    executor = {
        "heartbeat_seconds": args.heartbeat,
        "unreachable_seconds": args.unreachable,
        "evict_seconds": args.evict,
        "kill_grace_seconds": min(1.0, args.heartbeat),
        "loop_seconds": args.loop,
    }
    server = BerthServer(
        "failover", {"executor": executor, "pools": {"real": {"slots": {"default": 1}}}}
    )
    server.start()
    api = Api(server)
    files: list[Path] = []
    marks = marks_dir()

    def stamping(path: Path) -> dict[str, Any]:
        files.append(path)
        # the shell becomes `sleep`, so its pid (the line's first field) is the job's process
        stamp = f"{path}.$BERTH_ATTEMPT"
        return job(["bash", "-c", f"echo $$ $EPOCHREALTIME > {stamp}; exec sleep 60"], "real")

    try:
        tokens = mint(server, "fo", 3)
        result: dict[str, Any] = {**stub(args), **executor}

        # (a) fast path: the worker restarts with the same token and holds nothing
        fast = marks / "fast.txt"
        w = common.spawn_real_worker(server, tokens[0][1], "real", "fast-1")
        if not wait_attached(server, 1, 30.0):
            return {**result, "error": "worker did not attach"}
        fast_job = api.submit(stamping(fast))
        if len(_wait_starts(fast, 1, 30.0)) < 1:
            return {**result, "error": "fast path: the job never started"}
        t_kill = time.time()
        os.killpg(w.pid, signal.SIGKILL)
        restarted = common.spawn_real_worker(server, tokens[0][1], "real", "fast-2")
        starts = _wait_starts(fast, 2, 60.0)
        if len(starts) < 2:
            return {**result, "error": "fast path: the job did not start again within 60 s"}
        result["fast_s"] = round(starts[1][1] - t_kill, 3)
        result["fast_target_s"] = args.heartbeat + 1.0
        # Cancel it so that its lease does not come back to take the silent path's slot.
        api.client.post(f"/api/v1/jobs/{fast_job['id']}/cancel")
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            if api.client.get(f"/api/v1/jobs/{fast_job['id']}").json()["state"] == "cancelled":
                break
            time.sleep(0.05)
        benchlib.stop(restarted)
        _kill_jobs(fast)

        # (b) silent path: two workers, the holder is killed and never comes back
        silent = marks / "silent.txt"
        procs = {
            name: common.spawn_real_worker(server, token, "real", name)
            for name, token in tokens[1:]
        }
        if not wait_attached(server, 2, 30.0):
            return {**result, "error": "silent path: workers did not attach"}
        created = api.submit(stamping(silent))
        if len(_wait_starts(silent, 1, 30.0)) < 1:
            return {**result, "error": "silent path: the job never started"}
        holder = api.client.get(f"/api/v1/jobs/{created['id']}").json()["worker"]
        t_kill = time.time()
        os.killpg(procs[holder].pid, signal.SIGKILL)
        starts = _wait_starts(silent, 2, 60.0)
        if len(starts) < 2:
            return {**result, "error": "silent path: the job did not start again within 60 s"}
        result["silent_s"] = round(starts[1][1] - t_kill, 3)
        result["silent_target_s"] = args.unreachable + args.evict + args.heartbeat
        final = api.client.get(f"/api/v1/jobs/{created['id']}").json()
        result["silent_attempt"] = final["attempt"]
        return result
    finally:
        api.close()
        benchlib.stop_all()
        for path in files:
            _kill_jobs(path)
        shutil.rmtree(marks, ignore_errors=True)
