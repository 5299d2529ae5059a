"""Artifact store speed: a 1 GiB blob up and down through the server, and what an input costs.

Two measurements against a real `berth serve` on a real, migrated Postgres, its store the
default `local` provider (a folder under $BERTH_HOME on this disk):

- throughput: PUT then GET of one blob through `/api/v1/cas/{sha256}` with berth's own HTTP
  store client (the path a worker's upload and download take), against `cp` of the same file
  on the same disk, the ceiling (and `cp` plus fsync, since the store fsyncs before it answers);
- input latency: from submit to finish (server timestamps, so no polling granularity) of a
  `true` job on a remote worker, with one 1 KiB input already in the store against none.

    python bench/berth/cas_bench.py [--size-mib 1024] [--runs 20]

Prints one JSON object. Numbers depend on the disk; run on a quiet machine.
"""

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH_DIR.parent))

from service.cas.http import HttpStore  # noqa: E402
from service.db import migrate  # noqa: E402
from tests import pg  # noqa: E402
from tests.procs import Server, Worker, wait_for  # noqa: E402

MIB = 1 << 20
POOL = {"pools": {"bench": {"slots": {"default": 1}}}}


def make_file(path: Path, size_mib: int) -> str:
    """`size_mib` MiB of incompressible data; its sha256."""
    digest = hashlib.sha256()
    block = os.urandom(MIB)
    with path.open("wb") as f:
        for i in range(size_mib):
            chunk = i.to_bytes(8, "little") + block[8:]
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


async def read_file(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, MIB):
            yield chunk


async def through_server(s: Server, src: Path, name: str, dst: Path) -> tuple[float, float]:
    store = HttpStore(f"{s.url}/api/v1/cas", headers={"Authorization": f"Bearer {s.token}"})
    try:
        started = time.perf_counter()
        await store.put(read_file(src), sha256=name)
        up = time.perf_counter() - started
        started = time.perf_counter()
        with dst.open("wb") as f:
            async for chunk in store.get(name):
                f.write(chunk)
            os.fsync(f.fileno())
        down = time.perf_counter() - started
    finally:
        await store.aclose()
    return up, down


def job_seconds(s: Server, inputs: list[dict[str, str]]) -> float:
    r = s.api("POST", "/api/v1/jobs", json={"command": ["true"], "pool": "bench", "inputs": inputs})
    r.raise_for_status()
    job = r.json()["id"]
    shown = wait_for(
        lambda: (j := s.api("GET", f"/api/v1/jobs/{job}").json())["state"] == "succeeded" and j,
        60,
        "the job",
        every=0.02,
    )
    created = datetime.fromisoformat(shown["created_at"])
    return (datetime.fromisoformat(shown["finished_at"]) - created).total_seconds()


def measure(db_url: str, work: Path, size_mib: int, runs: int) -> dict[str, object]:
    s = Server(home=work / "server", db_url=db_url, config=POOL, builtin_worker=False).start()
    worker = None
    try:
        src = work / "blob.bin"
        name = make_file(src, size_mib)
        subprocess.run(["sync"], check=True)
        cp = timed(["cp", str(src), str(work / "cp.bin")])
        cp_sync = cp + timed(["sync", str(work / "cp.bin")])
        (work / "cp.bin").unlink()
        up, down = asyncio.run(through_server(s, src, name, work / "back.bin"))
        assert hashlib.sha256((work / "back.bin").read_bytes()).hexdigest() == name
        (work / "back.bin").unlink()
        src.unlink()

        small = b"x" * 1024
        sha = hashlib.sha256(small).hexdigest()
        s.api("PUT", f"/api/v1/cas/{sha}", content=small).raise_for_status()
        token = s.worker_token("bench1")
        worker = Worker(server=s, token=token, pool="bench", home=work / "worker").start()
        wait_for(
            lambda: any(w["attached"] for w in s.api("GET", "/api/v1/workers").json()),
            30,
            "the worker",
        )
        one = [{"name": "in.txt", "sha256": sha, "kind": "file"}]
        job_seconds(s, [])  # warm the worker and the server's pools
        bare, with_input = [], []
        for _ in range(runs):  # interleaved, so drift hits both alike
            bare.append(job_seconds(s, []))
            with_input.append(job_seconds(s, one))
    finally:
        if worker is not None:
            worker.stop()
        s.stop()
    gib = size_mib / 1024
    return {
        "scenario": "cas",
        "size_mib": size_mib,
        "cp_gib_s": round(gib / cp, 2),
        "cp_fsync_gib_s": round(gib / cp_sync, 2),
        "upload_gib_s": round(gib / up, 2),
        "download_gib_s": round(gib / down, 2),
        "runs": runs,
        "job_ms_median_no_input": round(statistics.median(bare) * 1000, 1),
        "job_ms_median_one_input": round(statistics.median(with_input) * 1000, 1),
        "input_added_ms_median": round(
            (statistics.median(with_input) - statistics.median(bare)) * 1000, 1
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="berth-cas-bench-", dir="/var/tmp"))
    try:
        with pg.server() as admin, pg.scratch(admin, "bench_cas") as url:
            migrate.upgrade(url)
            result = measure(url, work, args.size_mib, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
