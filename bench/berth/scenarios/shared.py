"""What several scenarios use: the admin API client, job bodies, paced submits, tokens, marks."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
import httpx
from common import BerthServer, benchlib

WARMUP_JOBS = 3
MAX_BATCH = 5000  # the API's limit per request
SAFE_BATCH = 36  # 36 seven-character ids fit the audit target's 256 characters


def stub(args: argparse.Namespace) -> dict[str, Any]:
    """The keys every result carries, also the whole of a failed run's."""
    return {"system": "berth", "scenario": args.scenario, "processes": args.processes}


def job(command: list[str], pool: str) -> dict[str, Any]:
    return {"command": command, "pool": pool}


class Api:
    """A keep-alive client with the admin token."""

    def __init__(self, server: BerthServer) -> None:
        self.client = httpx.Client(base_url=server.url, headers=server.headers(), timeout=60)
        self.fallbacks = 0

    def submit(self, body: Any) -> Any:
        r = self.client.post("/api/v1/jobs", json=body)
        if r.status_code != 201:
            raise RuntimeError(f"submit: {r.status_code} {r.text[:300]}")
        return r.json()

    def submit_many(self, bodies: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for i in range(0, len(bodies), MAX_BATCH):
            chunk = bodies[i : i + MAX_BATCH]
            try:
                ids += self.submit(chunk)["ids"]
            except RuntimeError:
                # Known berth bug (service/domain/jobs.py): the submit's audit entry names the
                # first 50 ids in a varchar(256), so once ids reach 5 digits a batch of more
                # than ~40 jobs fails with a 500 (all or none: nothing was queued). Resubmit in
                # batches short enough to fit, and say so in the result.
                self.fallbacks += 1
                for j in range(0, len(chunk), SAFE_BATCH):
                    ids += self.submit(chunk[j : j + SAFE_BATCH])["ids"]
        return ids

    def close(self) -> None:
        self.client.close()


def wait_attached(server: BerthServer, n: int, timeout: float) -> bool:
    """Whether ``n`` workers are attached within ``timeout`` seconds (by SQL)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(common.attached_workers(server.db_url)) >= n:
            return True
        time.sleep(0.1)
    return False


def mint(server: BerthServer, prefix: str, n: int) -> list[tuple[str, str]]:
    """``n`` worker tokens on the server's database: (name, token) pairs."""
    return asyncio.run(common.mint_worker_tokens(server.db_url, prefix, n))


def tokens_file(server: BerthServer, prefix: str, n: int) -> Path:
    """``n`` worker tokens in a file for the simulators (``name<TAB>token`` lines)."""
    return common.write_tokens(server.home / f"{prefix}.tokens", mint(server, prefix, n))


def open_loop(
    api: Api, args: argparse.Namespace, body: Callable[[int], Any]
) -> tuple[dict[int, float], dict[str, Any]]:
    """Submit one job per scheduled instant; job id -> submit time, and submit-call stats."""
    schedule = benchlib.pace(args.rate, args.seconds)
    submitted: dict[int, float] = {}
    submit_s: list[float] = []
    max_lag = 0.0
    t0 = time.monotonic() + 0.05
    for k, offset in enumerate(schedule):
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            max_lag = max(max_lag, -delay)  # open loop: a late submit is sent late, not skipped
        at = time.time()
        created = api.submit(body(k))
        submit_s.append(time.time() - at)
        submitted[int(created["id"])] = at
    summary = benchlib.latency_summary(submit_s)
    return submitted, {
        "submit_p50_ms": summary["p50_ms"],
        "submit_p99_ms": summary["p99_ms"],
        "max_submit_lag_ms": round(max_lag * 1000, 3),
    }


def marks_dir(prefix: str = "failover-") -> Path:
    """A sticky folder every job's uid may append to, outside /tmp, /var/tmp and /dev/shm (a
    root worker's jobs get private ones of those, and their own uid: not the server's home)."""
    parent = Path("/var/lib/berth-bench") if os.geteuid() == 0 else Path(tempfile.gettempdir())
    parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o1777)
    return path
