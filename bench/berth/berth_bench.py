"""berth's side of the benchmark: one scenario per run, one JSON object as the last stdout line.

Runs with the project's interpreter (berth installed, server extra included). Every scenario
starts its own ``berth serve`` (no built-in worker) on a fresh, migrated database
``bench_berth_<scenario>``, on loopback, and stops everything it started on exit, on SIGTERM and
on the hard timeout (``--timeout``, default 115 s), as the peers' scripts do.

Scenarios (see ``bench/README.md``):

* ``dispatch``: simulated workers attached to an idle queue; jobs submitted open-loop at
  ``--rate`` for ``--seconds`` through ``POST /api/v1/jobs``; submit -> lease received;
* ``dispatch-real``: the same against a real ``berth worker``; submit -> job process started;
* ``drain``: ``--jobs`` queued (batched submit), then ``--workers`` simulated workers with
  ``--slots`` slots each drain them; jobs/s;
* ``submit``: one job per request (``--concurrency`` keep-alive connections, wrk when installed)
  and batches of ``--batch``; jobs/s;
* ``real``: ``true`` on two real ``berth worker`` processes; jobs/s;
* ``fleet``: ``--workers`` simulated workers attached at once, heartbeating every
  ``--heartbeat`` s; ack p99, server CPU and memory per worker over ``--window`` s;
* ``failover``: kill -9 of a real worker holding a job: seconds until the job starts again,
  for a restarted worker (fast path) and a silent one (the configured window).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import httpx
import psutil
from common import BerthServer, Profiler, benchlib

SCENARIOS = ("dispatch", "dispatch-real", "drain", "submit", "real", "fleet", "failover")
WARMUP_JOBS = 3
MAX_BATCH = 5000  # the API's limit per request
SAFE_BATCH = 36  # 36 seven-character ids fit the audit target's 256 characters


def _stub(args: argparse.Namespace) -> dict[str, Any]:
    return {"system": "berth", "scenario": args.scenario, "processes": args.processes}


def _job(command: list[str], pool: str) -> dict[str, Any]:
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


def _wait_attached(server: BerthServer, n: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(common.attached_workers(server.db_url)) >= n:
            return True
        time.sleep(0.1)
    return False


def _tokens_file(server: BerthServer, prefix: str, n: int) -> Path:
    pairs = asyncio.run(common.mint_worker_tokens(server.db_url, prefix, n))
    return common.write_tokens(server.home / f"{prefix}.tokens", pairs)


def _open_loop(api: Api, args: argparse.Namespace, body: Any) -> tuple[dict[int, float], Any]:
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
        job = api.submit(body(k))
        submit_s.append(time.time() - at)
        submitted[int(job["id"])] = at
    summary = benchlib.latency_summary(submit_s)
    return submitted, {
        "submit_p50_ms": summary["p50_ms"],
        "submit_p99_ms": summary["p99_ms"],
        "max_submit_lag_ms": round(max_lag * 1000, 3),
    }


# ---------------------------------------------------------------------------------------------
# 1. dispatch latency


def dispatch(args: argparse.Namespace) -> dict[str, Any]:
    collector = benchlib.make_collector()
    server = BerthServer("dispatch", {"pools": {"sim": {"slots": {"default": args.slots}}}})
    server.start()
    api = Api(server)
    try:
        tokens = _tokens_file(server, "disp", args.workers)
        sim, sim_log = common.spawn_sim(
            server, tokens, label="sim", extra=["--probe", "--seconds", str(args.timeout)]
        )
        if not _wait_attached(server, args.workers, 30.0):
            return {**_stub(args), "error": "simulated workers did not attach"}
        for _ in range(WARMUP_JOBS):
            api.submit(_job(["true"], "sim"))
        if not collector.wait_jobs(WARMUP_JOBS, 30.0):
            return {**_stub(args), "error": "warm-up jobs were not leased"}
        collector.jobs.clear()
        with Profiler(server, "dispatch"):
            submitted, submit_stats = _open_loop(api, args, lambda _k: _job(["true"], "sim"))
        n = len(submitted)
        collector.wait_jobs(n, 15.0)
        lat = [r.started - submitted[j] for j, r in collector.jobs.items() if j in submitted]
        states = asyncio.run(common.wait_states(server.db_url, "succeeded", n + WARMUP_JOBS, 15))
        common.interrupt(sim)
        sim_result = common.last_json(sim_log)
        result = {
            **_stub(args),
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


def dispatch_real(args: argparse.Namespace) -> dict[str, Any]:
    server = BerthServer("dispatch-real", {"pools": {"real": {"slots": {"default": args.slots}}}})
    server.start()
    api = Api(server)
    # Each job runs as a uid of its own with a private /tmp: it writes its stamp as a file of
    # its own in a sticky folder every uid may create files in (one shared file would be
    # root's, or the first job's, and the others could not append to it).
    marks = _marks_dir("dispatch-real-")

    def body(k: int) -> dict[str, Any]:
        # bash's $EPOCHREALTIME: the wall clock when the job's process runs, no fork for `date`.
        return _job(["bash", "-c", f"echo $EPOCHREALTIME > {marks}/{k}.t"], "real")

    def lines() -> dict[int, float]:
        out = {}
        for path in marks.glob("*.t"):
            with contextlib.suppress(ValueError):
                out[int(path.stem)] = float(path.read_text().split()[0])
        return out

    try:
        tokens = asyncio.run(common.mint_worker_tokens(server.db_url, "real", 1))
        common.spawn_real_worker(server, tokens[0][1], "real", "w0")
        if not _wait_attached(server, 1, 30.0):
            return {**_stub(args), "error": "the real worker did not attach"}
        for k in range(WARMUP_JOBS):
            api.submit(body(-1 - k))
        ok, _ = asyncio.run(common.wait_states(server.db_url, "succeeded", WARMUP_JOBS, 30))
        if not ok:
            states = asyncio.run(common.job_states(server.db_url))
            return {**_stub(args), "error": f"warm-up jobs did not run: {states}"}
        submitted_by_id, submit_stats = _open_loop(api, args, body)
        # ids were assigned in submission order, k = 0, 1, ...
        submitted = dict(enumerate(submitted_by_id[i] for i in sorted(submitted_by_id)))
        n = len(submitted)
        done, _ = asyncio.run(common.wait_states(server.db_url, "succeeded", n + WARMUP_JOBS, 30))
        started = lines()
        lat = [started[k] - submitted[k] for k in submitted if k in started]
        result = {
            **_stub(args),
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


# ---------------------------------------------------------------------------------------------
# 2. drain


def drain(args: argparse.Namespace, started_at: float) -> dict[str, Any]:
    n = args.jobs
    config = {"pools": {"sim": {"slots": {"default": args.slots}}}}
    server = BerthServer("drain", config)
    server.start()
    api = Api(server)
    try:
        tokens = _tokens_file(server, "drain", args.workers)
        t_enqueue = time.time()
        api.submit_many([_job(["true"], "sim")] * n)
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
        result: dict[str, Any] = {**_stub(args)}
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


# ---------------------------------------------------------------------------------------------
# 3. submit


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
    body = _job(["true"], "sim")
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
    body = [_job(["true"], "sim")] * args.batch
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


def submit(args: argparse.Namespace) -> dict[str, Any]:
    server = BerthServer("submit", {"pools": {"sim": {"slots": {"default": 1}}}})
    server.start()
    try:
        Api(server).submit(_job(["true"], "sim"))  # warm the app (imports, pools, plans)
        with Profiler(server, "submit"):
            if shutil.which("wrk") and not args.python_client:
                single = _single_wrk(server, args)
            else:
                single = asyncio.run(_single_httpx(server, args))
            batch = asyncio.run(_batches(server, args))
        result = {
            **_stub(args),
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


# ---------------------------------------------------------------------------------------------
# 4. real jobs


def real(args: argparse.Namespace) -> dict[str, Any]:
    server = BerthServer("real", {"pools": {"real": {"slots": {"default": args.slots}}}})
    server.start()
    api = Api(server)
    try:
        tokens = asyncio.run(common.mint_worker_tokens(server.db_url, "real", args.workers))
        for i, (_, token) in enumerate(tokens):
            common.spawn_real_worker(server, token, "real", f"w{i}")
        if not _wait_attached(server, args.workers, 30.0):
            return {**_stub(args), "error": "real workers did not attach"}
        api.submit(_job(["true"], "real"))  # warm-up: imports on the worker's first job
        asyncio.run(common.wait_states(server.db_url, "succeeded", 1, 30))
        n = args.jobs
        t0 = time.time()
        api.submit_many([_job(["true"], "real")] * n)
        ok, t1 = asyncio.run(common.wait_states(server.db_url, "succeeded", n + 1, 100))
        states = asyncio.run(common.job_states(server.db_url))
        result = {
            **_stub(args),
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


# ---------------------------------------------------------------------------------------------
# 5. fleet


def fleet(args: argparse.Namespace, started_at: float) -> dict[str, Any]:
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
        tokens = _tokens_file(server, "fleet", n)
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
            **_stub(args),
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


# ---------------------------------------------------------------------------------------------
# 6. failover


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


def _marks_dir(prefix: str = "failover-") -> Path:
    """A sticky folder every job's uid may append to, outside /tmp, /var/tmp and /dev/shm (a
    root worker's jobs get private ones of those, and their own uid: not the server's home)."""
    parent = Path("/var/lib/berth-bench") if os.geteuid() == 0 else Path(tempfile.gettempdir())
    parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o1777)
    return path


def failover(args: argparse.Namespace) -> dict[str, Any]:
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
    marks = _marks_dir()

    def job(path: Path) -> dict[str, Any]:
        files.append(path)
        # the shell becomes `sleep`, so its pid (the line's first field) is the job's process
        stamp = f"{path}.$BERTH_ATTEMPT"
        return _job(["bash", "-c", f"echo $$ $EPOCHREALTIME > {stamp}; exec sleep 60"], "real")

    try:
        tokens = asyncio.run(common.mint_worker_tokens(server.db_url, "fo", 3))
        result: dict[str, Any] = {**_stub(args), **executor}

        # (a) fast path: the worker restarts with the same token and holds nothing
        fast = marks / "fast.txt"
        w = common.spawn_real_worker(server, tokens[0][1], "real", "fast-1")
        if not _wait_attached(server, 1, 30.0):
            return {**result, "error": "worker did not attach"}
        fast_job = api.submit(job(fast))
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
        if not _wait_attached(server, 2, 30.0):
            return {**result, "error": "silent path: workers did not attach"}
        created = api.submit(job(silent))
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


# ---------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="berth benchmark scenarios")
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--seconds", type=float, default=20.0, help="dispatch/submit window")
    p.add_argument("--rate", type=float, default=50.0, help="dispatch: jobs per second")
    p.add_argument("--jobs", type=int, default=None, help="drain 20000, real 500, submit 20000")
    p.add_argument("--workers", type=int, default=None, help="simulated or real workers")
    p.add_argument("--slots", type=int, default=None, help="slots per worker")
    p.add_argument("--no-analyze", action="store_true", help="drain: skip ANALYZE")
    p.add_argument("--concurrency", type=int, default=16, help="submit: connections")
    p.add_argument("--batch", type=int, default=500, help="submit: jobs per batch")
    p.add_argument("--batch-concurrency", type=int, default=2)
    p.add_argument("--python-client", action="store_true", help="submit: httpx, not wrk")
    p.add_argument("--heartbeat", type=float, default=None, help="fleet 10, failover 1")
    p.add_argument("--window", type=float, default=20.0, help="fleet: measured seconds")
    p.add_argument("--connect-concurrency", type=int, default=100)
    p.add_argument("--no-compression", action="store_true", help="fleet: sims without deflate")
    p.add_argument("--unreachable", type=float, default=2.0)
    p.add_argument("--evict", type=float, default=3.0)
    p.add_argument("--loop", type=float, default=0.25, help="failover: leader loop cadence")
    p.add_argument("--timeout", type=float, default=115.0, help="hard limit, seconds")
    p.add_argument("--processes", type=int, default=1, help="berth serve --processes N")
    return p


DEFAULTS: dict[str, dict[str, Any]] = {
    "dispatch": {"workers": 2, "slots": 4},
    "dispatch-real": {"workers": 1, "slots": 4},
    "drain": {"jobs": 20_000, "workers": 4, "slots": 64},
    "submit": {"jobs": 20_000, "workers": 0, "slots": 1, "seconds": 10.0},
    "real": {"jobs": 500, "workers": 2, "slots": 4},
    "fleet": {"workers": 1000, "heartbeat": 10.0, "slots": 1},
    "failover": {"heartbeat": 1.0, "workers": 3, "slots": 1},
}


def main(argv: list[str] | None = None) -> int:
    raw = argv if argv is not None else sys.argv[1:]
    args = parser().parse_args(raw)
    for key, value in DEFAULTS[args.scenario].items():
        if getattr(args, key) is None or (key == "seconds" and "--seconds" not in raw):
            setattr(args, key, value)
    started_at = time.monotonic()
    common.PROCESSES = args.processes
    stub = _stub(args)
    benchlib.install_guards(args.timeout, stub)
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())

    def go() -> int:
        match args.scenario:
            case "dispatch":
                result = dispatch(args)
            case "dispatch-real":
                result = dispatch_real(args)
            case "drain":
                result = drain(args, started_at)
            case "submit":
                result = submit(args)
            case "real":
                result = real(args)
            case "fleet":
                result = fleet(args, started_at)
            case _:
                result = failover(args)
        benchlib.emit(result)
        return 1 if "error" in result else 0

    return benchlib.main_guard(go, stub)


if __name__ == "__main__":
    sys.exit(main())
