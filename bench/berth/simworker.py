"""Protocol-level berth worker simulators: many workers in one asyncio process.

Each simulated worker is a real websocket client (the ``websockets`` asyncio client, set up as
``berth worker`` sets it up: same headers, size limit, keep-alive pings and compression) speaking
berth's worker protocol from ``service.protocol``:

* ``hello`` (protocol 1, its pool, a fresh instance uuid, ``--parallel``), then ``welcome``;
* every lease is answered at once with ``started`` then ``finished(succeeded, exit 0)`` under the
  lease's (job, epoch) -- no process runs, so this measures the control plane alone;
* a ``beat`` every heartbeat (the welcome's, or ``--heartbeat``), the first one at a random offset
  inside the first period so a fleet's beats spread out; each ``ack`` is matched to its beat and
  the round trip recorded.

One token per worker (a worker's name is its token's name): ``--tokens FILE`` holds
``name<TAB>token`` lines, one simulated worker each. With ``--probe`` every lease is reported to
the orchestrator's collector (``bench/benchlib.py``) with the time it was received.

Stops after ``--seconds``, on SIGTERM/SIGINT, or once ``--exit-after-results`` results were
acknowledged across the fleet; then prints one JSON object (the last stdout line) with counts,
attach times and heartbeat-ack latencies, and with ``--stats-file`` dumps every (beat sent at,
ack latency) pair so the orchestrator can pick its own measurement window.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))

import benchlib  # noqa: E402
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

from service import __version__, protocol  # noqa: E402

HOST = protocol.Host(cpus=8, load=0.1, free_memory_gb=16.0, free_disk_gb=100.0)
SUCCEEDED = "succeeded"


@dataclass
class Stats:
    started_wall: float = field(default_factory=time.time)
    attached: int = 0
    refused: int = 0
    failed: int = 0
    disconnected: int = 0
    errors: list[str] = field(default_factory=list)
    attach_s: list[float] = field(default_factory=list)
    all_attached_wall: float | None = None
    leases: int = 0
    result_acks: int = 0
    stale: int = 0
    exits: int = 0
    first_lease_wall: float | None = None
    last_result_ack_wall: float | None = None
    beats: int = 0
    acks: list[tuple[float, float]] = field(default_factory=list)  # (beat sent at, latency s)

    def error(self, message: str) -> None:
        if len(self.errors) < 10:
            self.errors.append(message[:300])


class Fleet:
    def __init__(self, args: argparse.Namespace, tokens: list[tuple[str, str]]) -> None:
        self.args = args
        self.tokens = tokens
        self.stats = Stats()
        self.stop = asyncio.Event()
        self.sem = asyncio.Semaphore(args.connect_concurrency)
        self.url = args.server.rstrip("/").replace("http", "ws", 1) + protocol.WORKER_PATH

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.worker(name, token)) for name, token in self.tokens]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), timeout=self.args.seconds)
        self.stop.set()
        _, pending = await asyncio.wait(tasks, timeout=10.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def worker(self, name: str, token: str) -> None:
        s = self.stats
        for attempt in range(self.args.retries + 1):
            if self.stop.is_set():
                return
            t0 = time.monotonic()
            try:
                async with self.sem:
                    ws = await connect(
                        self.url,
                        additional_headers={"Authorization": f"Bearer {token}"},
                        open_timeout=self.args.open_timeout,
                        max_size=64 * 1024 * 1024,
                        compression=None if self.args.no_compression else "deflate",
                    )
                    hello = protocol.Hello(
                        protocol=protocol.PROTOCOL_VERSION,
                        berth_version=__version__,
                        pool=self.args.pool,
                        instance=uuid.uuid4().hex,
                        parallel=self.args.parallel,
                        host=HOST,
                        python="3.11.0",
                    )
                    await ws.send(protocol.encode(hello).decode())
                    first = protocol.decode_to_worker(
                        await asyncio.wait_for(ws.recv(), timeout=self.args.open_timeout)
                    )
            except (OSError, TimeoutError, ConnectionClosed, InvalidStatus) as exc:
                s.error(f"{name}: attach attempt {attempt + 1}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5 + random.random())
                continue
            if isinstance(first, protocol.Refused):
                s.refused += 1
                s.error(f"{name}: refused: {first.reason}")
                await ws.close()
                return
            if not isinstance(first, protocol.Welcome):
                s.error(f"{name}: first frame {type(first).__name__}")
                await ws.close()
                return
            s.attach_s.append(time.monotonic() - t0)
            s.attached += 1
            if s.attached == len(self.tokens):
                s.all_attached_wall = time.time()
            await self.session(ws, first)
            return
        s.failed += 1

    async def session(self, ws: ClientConnection, welcome: protocol.Welcome) -> None:
        period = self.args.heartbeat or welcome.heartbeat_seconds
        pending: dict[int, tuple[float, float]] = {}
        beater = asyncio.create_task(self.beater(ws, period, pending))
        reader = asyncio.create_task(self.reader(ws, pending))
        stopper = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not self.stop.is_set():
                self.stats.disconnected += 1
        finally:
            for task in (beater, reader, stopper):
                task.cancel()
            await asyncio.gather(beater, reader, stopper, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), timeout=2.0)

    async def beater(
        self, ws: ClientConnection, period: float, pending: dict[int, tuple[float, float]]
    ) -> None:
        await asyncio.sleep(random.uniform(0, period))
        seq = 0
        next_at = time.monotonic()
        while True:
            seq += 1
            pending[seq] = (time.time(), time.monotonic())
            await ws.send(protocol.encode(protocol.Beat(seq=seq, host=HOST)).decode())
            self.stats.beats += 1
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def reader(self, ws: ClientConnection, pending: dict[int, tuple[float, float]]) -> None:
        s = self.stats
        probe = self.args.probe
        seq = 0  # report sequence numbers of this session
        results: collections.deque[int] = collections.deque()  # seqs of unreceived results
        with contextlib.suppress(ConnectionClosed):
            async for raw in ws:
                frame = protocol.decode_to_worker(raw)
                match frame:
                    case protocol.Ack():
                        sent = pending.pop(frame.seq, None)
                        if sent is not None:
                            s.acks.append((sent[0], time.monotonic() - sent[1]))
                    case protocol.Lease() | protocol.Leases():
                        now = time.time()
                        batch = frame.leases if isinstance(frame, protocol.Leases) else (frame,)
                        for lease in batch:
                            s.leases += 1
                            if s.first_lease_wall is None:
                                s.first_lease_wall = now
                            if probe:
                                benchlib.probe_job(lease.job, 0.0, now)
                            key = {"job": lease.job, "epoch": lease.epoch}
                            seq += 1
                            started = protocol.Started(seq=seq, **key)
                            await ws.send(protocol.encode(started).decode())
                            seq += 1
                            done = protocol.Finished(seq=seq, **key, state=SUCCEEDED, exit_code=0)
                            await ws.send(protocol.encode(done).decode())
                            results.append(seq)
                    case protocol.Received():
                        while results and results[0] <= frame.upto:
                            results.popleft()
                            s.result_acks += 1
                            s.last_result_ack_wall = time.time()
                        target = self.args.exit_after_results
                        if target and s.result_acks >= target:
                            self.stop.set()
                    case protocol.Stale():
                        s.stale += 1
                    case protocol.Exit():
                        s.exits += 1
                        return
                    case _:
                        pass

    def result(self) -> dict[str, Any]:
        s = self.stats
        attach = benchlib.latency_summary(s.attach_s)
        acks = benchlib.latency_summary(lat for _, lat in s.acks)
        return {
            "system": "berth-sim",
            "workers": len(self.tokens),
            "attached": s.attached,
            "refused": s.refused,
            "failed": s.failed,
            "disconnected": s.disconnected,
            "started_wall": s.started_wall,
            "all_attached_wall": s.all_attached_wall,
            "attach_s": (
                round(s.all_attached_wall - s.started_wall, 3) if s.all_attached_wall else None
            ),
            "attach_p50_ms": attach["p50_ms"],
            "attach_p99_ms": attach["p99_ms"],
            "leases": s.leases,
            "result_acks": s.result_acks,
            "stale": s.stale,
            "exits": s.exits,
            "first_lease_wall": s.first_lease_wall,
            "last_result_ack_wall": s.last_result_ack_wall,
            "beats": s.beats,
            "acks": len(s.acks),
            "ack_p50_ms": acks["p50_ms"],
            "ack_p99_ms": acks["p99_ms"],
            "errors": s.errors,
        }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="simulated berth workers")
    p.add_argument("--server", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--tokens", type=Path, required=True, help="name<TAB>token per line")
    p.add_argument("--pool", default="sim")
    p.add_argument("--parallel", type=int, default=0, help="hello's parallel (0: pool slots)")
    p.add_argument("--heartbeat", type=float, default=0.0, help="0: the welcome's period")
    p.add_argument("--seconds", type=float, default=100.0, help="run at most this long")
    p.add_argument("--exit-after-results", type=int, default=0)
    p.add_argument("--connect-concurrency", type=int, default=64)
    p.add_argument("--open-timeout", type=float, default=30.0)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--probe", action="store_true", help="report each lease to the collector")
    p.add_argument("--no-compression", action="store_true", help="no permessage-deflate")
    p.add_argument("--stats-file", type=Path, default=None)
    return p


def read_tokens(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            name, token = line.split("\t", 1)
            out.append((name, token.strip()))
    return out


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet(args, read_tokens(args.tokens))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, fleet.stop.set)
    await fleet.run()
    if args.stats_file is not None:
        args.stats_file.write_text(
            json.dumps({"acks": fleet.stats.acks, "attach_s": fleet.stats.attach_s})
        )
    return fleet.result()


def main() -> int:
    args = parser().parse_args()
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = asyncio.run(amain(args))
    benchlib.emit(result)
    return 0 if result["attached"] == result["workers"] else 1


if __name__ == "__main__":
    sys.exit(main())
