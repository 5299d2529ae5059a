"""What one `berth job exec` session costs: memory in the server, the worker and the command.

A real `berth serve` on a real, migrated Postgres, one real `berth worker` (as root: per-job uid
and namespaces, as in production) running one job (`exec sleep 600`), and N exec sessions of
`cat` held open at once by one async client (one websocket each, as `berth job exec` opens).
Memory is RSS (psutil) before the sessions and once all N answered, divided by N: the server's
process, the worker's own process (its relay state and tasks), and the exec'd processes
themselves (a `cat` each, which is the command's cost, not berth's). Not asserted anywhere: a
session is meant to be a few KB in the server and worker, not a thread.

    python bench/berth/exec_bench.py [--sessions 200]

Prints one JSON object.
"""

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

BENCH_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH_DIR.parent))

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from service.db import migrate  # noqa: E402
from tests import pg  # noqa: E402
from tests.procs import Server, Worker, wait_for  # noqa: E402

POOL = {
    "pools": {"bench": {"slots": {"default": 1}, "exec": "member"}},
    # Production-like windows: a loaded machine must not fence the job under the measurement.
    "executor": {"heartbeat_seconds": 1.0, "unreachable_seconds": 10.0, "evict_seconds": 20.0},
}
KIB = 1024


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def children_rss(pid: int, name: str) -> int:
    """RSS of the worker's exec'd processes (by command name) together."""
    total = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.name() == name:
                total += child.memory_info().rss
        except psutil.Error:
            continue
    return total


async def open_session(url: str, token: str) -> ClientConnection:
    """An exec of `cat` that has answered (so it runs on the worker), left open."""
    ws = await connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=120
    )
    await ws.send(json.dumps({"command": ["cat"]}))
    started = json.loads(await ws.recv())
    assert started["type"] == "started", started
    await ws.send(b"ping\n")
    echoed = await ws.recv()
    assert echoed == b"\x01ping\n", echoed
    return ws


async def close_session(ws: ClientConnection) -> int | None:
    await ws.send(json.dumps({"eof": True}))
    async for message in ws:
        if isinstance(message, str) and json.loads(message)["type"] == "exit":
            await ws.close()
            return json.loads(message)["exit_code"]
    return None


async def sessions(s: Server, job: int, n: int, server_pid: int, worker_pid: int) -> dict:
    url = s.url.replace("http", "ws", 1) + f"/api/v1/jobs/{job}/exec"
    warm = await open_session(url, s.token)  # first-use allocations are not a session's cost
    await close_session(warm)
    before = (rss(server_pid), rss(worker_pid))
    started = time.perf_counter()
    opened = await asyncio.gather(*(open_session(url, s.token) for _ in range(n)))
    open_seconds = time.perf_counter() - started
    after = (rss(server_pid), rss(worker_pid))
    commands = children_rss(worker_pid, "cat")
    codes = await asyncio.gather(*(close_session(ws) for ws in opened))
    assert codes == [0] * n, codes
    return {
        "server_kib_per_session": round((after[0] - before[0]) / n / KIB, 1),
        "worker_kib_per_session": round((after[1] - before[1]) / n / KIB, 1),
        "command_kib_per_session": round(commands / n / KIB, 1),
        "open_seconds": round(open_seconds, 2),
    }


def measure(db_url: str, work: Path, n: int) -> dict[str, object]:
    s = Server(home=work / "server", db_url=db_url, config=POOL, builtin_worker=False).start()
    worker = None
    try:
        worker = Worker(
            server=s, token=s.worker_token("bench1"), pool="bench", home=work / "worker"
        ).start()
        wait_for(
            lambda: any(w["attached"] for w in s.api("GET", "/api/v1/workers").json()),
            30,
            "the worker",
        )
        r = s.api("POST", "/api/v1/jobs", json={"command": ["sleep", "600"], "pool": "bench"})
        job = int(r.json()["id"])
        wait_for(
            lambda: s.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "running",
            60,
            "the job running",
        )
        assert s.proc is not None
        assert worker.proc is not None
        found = asyncio.run(sessions(s, job, n, s.proc.pid, worker.proc.pid))
    finally:
        if worker is not None:
            worker.stop()
        s.stop()
    return {"scenario": "exec", "sessions": n, **found}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=200)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="berth-exec-bench-", dir="/var/tmp"))
    try:
        with pg.server() as admin, pg.scratch(admin, "bench_exec") as url:
            migrate.upgrade(url)
            result = measure(url, work, args.sessions)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
