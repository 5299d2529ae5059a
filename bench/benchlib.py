"""Shared, standard-library-only helpers for the benchmark scripts.

Every bench script runs inside its own peer venv, so this module must not import anything outside
the standard library. It provides:

* the result contract: :func:`emit` prints one JSON object as the last stdout line;
* a *probe*: task bodies report ``(job, submitted, started, finished)`` over a Unix datagram socket
  to a collector thread in the orchestrating process. This keeps measurement out of the system
  under test (no extra table writes or broker round trips) and works from any worker process,
  including forked pool children. Unix datagram sockets do not drop on Linux: a full queue blocks
  the sender instead, so the count is exact;
* process hygiene: children run in their own process group, are killed on exit, on SIGTERM/SIGINT,
  and when the hard timeout (SIGALRM) fires, so a stuck library can never hang a run;
* Postgres/Redis plumbing through the ``psql`` and ``redis-server`` binaries: no driver needed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://root@127.0.0.1:5432")
REDIS_HOST = "127.0.0.1"
REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "6379"))
PROBE_ENV = "BENCH_PROBE"

# ---------------------------------------------------------------------------------------------
# Results


def emit(result: dict[str, Any]) -> None:
    """Print the result object; the runner reads only the last stdout line."""
    print(json.dumps(result, sort_keys=False), flush=True)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (same as numpy's default) of already-sorted values."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_summary(latencies_s: Iterable[float]) -> dict[str, float]:
    values = sorted(x * 1000.0 for x in latencies_s)
    return {
        "p50_ms": round(percentile(values, 0.50), 3),
        "p95_ms": round(percentile(values, 0.95), 3),
        "p99_ms": round(percentile(values, 0.99), 3),
        "max_ms": round(values[-1], 3) if values else math.nan,
    }


# ---------------------------------------------------------------------------------------------
# Probe: task body -> orchestrator

# pid -> this process's probe socket. Keyed by pid because a forked pool child inherits the
# parent's module state, and sharing one socket object across processes is asking for trouble.
_probe_socks: dict[int, socket.socket] = {}


def _probe_socket() -> tuple[socket.socket, str] | None:
    path = os.environ.get(PROBE_ENV)
    if not path:
        return None
    sock = _probe_socks.get(os.getpid())
    if sock is None:
        sock = _probe_socks[os.getpid()] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    return sock, path


def probe_job(job: int, submitted: float, started: float) -> None:
    """Called at the end of a task body: report its timestamps to the orchestrator."""
    target = _probe_socket()
    if target is not None:
        sock, path = target
        sock.sendto(f"J {job} {submitted!r} {started!r} {time.time()!r}".encode(), path)


def probe_ready() -> None:
    """Called by a worker process right before it hands control to the library's worker loop."""
    target = _probe_socket()
    if target is not None:
        sock, path = target
        sock.sendto(f"R {os.getpid()} {time.time()!r}".encode(), path)


@dataclass
class JobRecord:
    submitted: float
    started: float
    finished: float


@dataclass
class Collector:
    """Receives probe datagrams on a background thread."""

    path: str
    jobs: dict[int, JobRecord] = field(default_factory=dict)
    ready: dict[int, float] = field(default_factory=dict)
    duplicates: int = 0
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Condition | None = None

    def start(self) -> None:
        self._changed = threading.Condition(self._lock)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # A big receive queue so that bursts of completions never stall the workers' sendto.
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self._sock.bind(self.path)
        self._thread = threading.Thread(target=self._run, name="probe-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._sock is not None
        assert self._changed is not None
        while True:
            try:
                data = self._sock.recv(256)
            except OSError:
                return  # closed by stop()
            if not data:
                return  # shutdown() wakes the blocked recv with an empty read
            parts = data.decode().split()
            with self._changed:
                if parts[0] == "J":
                    job = int(parts[1])
                    if job in self.jobs:
                        self.duplicates += 1
                    else:
                        self.jobs[job] = JobRecord(*(float(x) for x in parts[2:5]))
                elif parts[0] == "R":
                    self.ready[int(parts[1])] = float(parts[2])
                self._changed.notify_all()

    def count(self) -> int:
        with self._lock:
            return len(self.jobs)

    def wait_jobs(self, n: int, timeout: float) -> bool:
        """Block until ``n`` distinct jobs reported, or the timeout passes."""
        assert self._changed is not None
        with self._changed:
            return self._changed.wait_for(lambda: len(self.jobs) >= n, timeout)

    def wait_ready(self, n: int, timeout: float) -> bool:
        assert self._changed is not None
        with self._changed:
            return self._changed.wait_for(lambda: len(self.ready) >= n, timeout)

    def stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            Path(self.path).unlink()


def make_collector() -> Collector:
    """Bind a collector in a fresh temp dir and export its path for the children we spawn."""
    tmp = tempfile.mkdtemp(prefix="bench-probe-")
    collector = Collector(path=os.path.join(tmp, "probe.sock"))  # noqa: PTH118
    collector.start()
    os.environ[PROBE_ENV] = collector.path
    atexit.register(shutil.rmtree, tmp, True)
    return collector


# ---------------------------------------------------------------------------------------------
# Process hygiene

_children: list[subprocess.Popen[bytes]] = []


def spawn(
    cmd: list[str],
    *,
    log_path: Path | None = None,
    capture: bool = False,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group) so the whole tree can be killed.

    Output goes to ``log_path``, or to a pipe with ``capture``, else nowhere.
    """
    out: Any = subprocess.DEVNULL
    if capture:
        out = subprocess.PIPE
    elif log_path is not None:
        out = log_path.open("wb")
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    _children.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> int | None:
    """SIGTERM the child's process group, then SIGKILL it if it outlives ``grace`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    # Kill the group even if the leader exited: forked pool children may linger.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(2.0)
    return proc.returncode


def stop_all(grace: float = 5.0) -> None:
    while _children:
        stop(_children.pop(), grace)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    stop_all(grace=1.0)
    emit({"error": f"killed by signal {signum}"})
    os._exit(128 + signum)


def install_guards(hard_timeout_s: float, result_stub: dict[str, Any]) -> None:
    """Make this process unable to hang or leak children.

    SIGALRM fires after ``hard_timeout_s`` even if the event loop is wedged inside a C call, kills
    every child group, prints an error result and exits hard.
    """

    def on_alarm(_signum: int, _frame: FrameType | None) -> None:
        stop_all(grace=1.0)
        emit({**result_stub, "error": f"hard timeout after {hard_timeout_s:.0f}s"})
        os._exit(3)

    atexit.register(stop_all)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.setitimer(signal.ITIMER_REAL, hard_timeout_s)


# ---------------------------------------------------------------------------------------------
# Postgres and Redis


def pg_url(database: str) -> str:
    return f"{PG_DSN.rstrip('/')}/{database}"


def psql(database: str, sql: str, timeout: float = 60.0) -> str:
    """Run SQL through the psql binary (no driver needed) and return its unaligned output."""
    return subprocess.run(
        ["psql", pg_url(database), "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout,
    ).stdout.strip()


def recreate_database(name: str) -> str:
    """Drop (terminating any leftover sessions) and create a dedicated bench database."""
    psql("postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    psql("postgres", f'CREATE DATABASE "{name}"')
    return pg_url(name)


def redis_ping(timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def ensure_redis() -> None:
    """Start a throwaway, non-persistent redis-server if nothing answers on the port."""
    if redis_ping():
        return
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            REDIS_HOST,
            "--port",
            str(REDIS_PORT),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        check=True,
        timeout=15,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if redis_ping():
            return
        time.sleep(0.1)
    raise RuntimeError("redis-server did not answer within 10 s")


# ---------------------------------------------------------------------------------------------
# Common argument handling


def pace(rate: float, seconds: float) -> list[float]:
    """Offsets (s) of an open-loop schedule: fixed rate, independent of completions."""
    return [i / rate for i in range(int(rate * seconds))]


def log_dir(system: str) -> Path:
    """Where worker logs go, so a failed run can be read afterwards."""
    path = Path(tempfile.gettempdir()) / "berth-bench-logs" / system
    path.mkdir(parents=True, exist_ok=True)
    return path


def fail(result_stub: dict[str, Any], message: str) -> int:
    emit({**result_stub, "error": message})
    return 1


def main_guard(fn: Any, result_stub: dict[str, Any]) -> int:
    """Run ``fn()``; turn any exception into an error result instead of a traceback-only exit."""
    try:
        return int(fn())
    except Exception as exc:  # a result line must be printed whatever went wrong
        import traceback

        traceback.print_exc(file=sys.stderr)
        return fail(result_stub, f"{type(exc).__name__}: {exc}")
    finally:
        stop_all()
